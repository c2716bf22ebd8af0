/* Anthropic Messages requests in the OpenAI chat form. Engines that serve /v1/messages (vLLM,
 * SGLang, llama.cpp) convert the request to chat messages and render them with the model's chat
 * template, so the chat form is what their KV cache holds. kvroute's routing text for Messages
 * is the chat routing text of this form (routing/keys.h), and kvroute-sim renders it with its
 * chat template: one conversion, so the router and the simulated worker agree on what a turn
 * shares with the next.
 *
 * The conversion keeps only what the engine renders, so `cache_control` markers (which clients
 * move from turn to turn) never change the result:
 *   tools     each {name, description, input_schema} becomes {"type": "function", "function":
 *             {name, description, parameters: input_schema}}; a tool without input_schema (a
 *             server tool such as web_search_20250305) has the tool itself, minus
 *             cache_control, as its parameters, so its type and settings count
 *   system    a non-empty string or array of blocks becomes the first message, role "system"
 *   messages  in order, each content block:
 *               text                 a text part
 *               thinking             a text part holding its `thinking` text (the signature
 *                                    is not rendered)
 *               image, document      {"type", "source"}: only the source counts
 *               tool_use             a tool call {name, arguments: input}; the id is not
 *                                    rendered
 *               tool_result          a message of its own, role "tool", tool_call_id =
 *                                    tool_use_id, content its text or blocks (converted as
 *                                    above), placed where the block stood: the blocks before
 *                                    it and after it become messages of the original role
 *               anything else        the block minus cache_control, as an opaque part
 *             a string content stays a string; absent or null content gives a message with
 *             its role only
 * Values of the wrong type are passed on as they are (validation is the caller's job): the
 * routing text then digests them, the sim's template refuses them. Strings are shared with
 * the input (referenced, never copied). */
#ifndef KVR_ROUTING_ANTHROPIC_H
#define KVR_ROUTING_ANTHROPIC_H
#include <jansson.h>

/** The chat form of the Messages request `body`: a new object {"messages": [...]} plus
 *  "tools": [...] when the body has a non-empty tools array (caller decrefs). NULL when
 *  memory ran out. `body` need not be valid: a non-object gives {"messages": []}. */
json_t *kvr_anthropic_to_chat(const json_t *body);

/** Appends the chat messages one Anthropic message `m` becomes to the array `out` (one, or
 *  more when it holds tool_result blocks). Returns 0, or -1 when memory ran out. */
int kvr_anthropic_message_to_chat(const json_t *m, json_t *out);

#endif
