/* kvroute-sim's chat template: renders an OpenAI request into prompt token ids the way a real
 * engine applies its chat template before tokenizing. The layout follows Llama 3.1's template:
 *
 *   <|begin_of_text|>
 *   [tools]   <|start_header_id|>system<|end_header_id|> "\n\n" tool JSON… <|eot_id|>
 *   per message <|start_header_id|>role[:name]<|end_header_id|> "\n\n" content
 *               [tool calls: <|python_tag|> name arguments <|eom_id|>]  [tool result id] <|eot_id|>
 *   [generation prompt] <|start_header_id|>assistant<|end_header_id|> "\n\n"
 *
 * Each text field is tokenized on its own and the pieces are joined with special tokens, so a
 * conversation re-sent with more messages renders to a longer sequence whose head is exactly the
 * previous rendering, and the generation prompt equals the head of the next assistant message.
 * Tools are rendered in the order given (as real templates do). Non-text parts (image_url,
 * input_audio, file, …) become a media token plus 8 ids derived from a digest of the part, so
 * different media never share cache blocks. */
#ifndef KVR_SIM_TEMPLATE_H
#define KVR_SIM_TEMPLATE_H
#include <jansson.h>

#include "tokenizer.h"

/** Renders `messages` (a JSON array of OpenAI chat messages) and `tools` (NULL or a JSON array)
 *  into `out`, appending ids. With `add_generation_prompt` the assistant header is appended.
 *  Returns 0, or -1 with `*err` set to a static message for a 400 (and `*param` to the
 *  offending field) when the shape is invalid: messages not a non-empty array, a message not
 *  an object, role not a string, content not a string/array of parts/null, a part without a
 *  string `type`, a text part without string `text`, tools not an array of objects. */
int kvr_sim_render_chat(kvr_sim_toks *out, const json_t *messages, const json_t *tools,
                        int add_generation_prompt, const char **err, const char **param);

/* The same rendering in parts, for callers that splice stored ids in between (the Responses
 * API's previous_response_id): head + messages + … + generation prompt gives exactly the ids
 * kvr_sim_render_chat() gives for the concatenated messages. */

/** Appends <|begin_of_text|> and, when `tools` is a non-empty array, its system block.
 *  Returns 0 or -1 with `*err`/`*param` as above. */
int kvr_sim_render_chat_head(kvr_sim_toks *out, const json_t *tools, const char **err,
                             const char **param);
/** Appends every message of the array `messages` (which may be empty). Returns 0 or -1. */
int kvr_sim_render_messages(kvr_sim_toks *out, const json_t *messages, const char **err,
                            const char **param);
/** Appends the generation prompt: the assistant header, i.e. the head of the next assistant
 *  message, whose content is then the generated ids followed by <|eot_id|>. */
void kvr_sim_render_gen_prompt(kvr_sim_toks *out);

/** Renders a completions `prompt`: a string (tokenized after <|begin_of_text|>, as vLLM adds
 *  special tokens to text prompts), an array of token ids (used as given, like vLLM), or a
 *  one-element array holding either. Several prompts per request are refused. Returns 0 or -1
 *  with `*err` as above (ids outside the vocabulary are refused). */
int kvr_sim_render_completion(kvr_sim_toks *out, const json_t *prompt, const char **err);

#endif
