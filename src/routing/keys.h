/* Routing keys (DESIGN §5, §10): from a parsed request body (and its headers) derive
 *  - the session key: exact identity of a conversation, compared for equality only;
 *  - the routing text: what the engine will cache, in the order its chat template renders it,
 *    serialized so that turn N's text is a byte prefix of turn N+1's.
 *
 * Everything is built from decoded JSON values (jansson), so the escaped and raw spellings of the
 * same text ("\u00e9" / "é", "\/" / "/") give the same keys.
 *
 * Routing text framing. Bytes 0x1C-0x1F never occur in normal text, so they frame it:
 *   RS (0x1E) <tag>          starts a record: a chat message (tag = its role), a tool definition
 *                            ("#tool"), Responses instructions ("#instructions") or input item
 *                            ("#function_call", "#function_call_output", "#item");
 *   US (0x1F) <letter> <value>  one field of the record: 'n' name, 'i' tool_call_id / call_id,
 *                            'c' a text part, 'x' a non-text part as the hex XXH3-128 digest of
 *                            its canonical JSON, 'f' a tool call's function name, 'a' its
 *                            arguments, 'd' a tool description, 'p' a tool's parameters as
 *                            canonical JSON, 'j' a tool without a function name as canonical JSON;
 *   GS (0x1D)                ends the record.
 * A record is complete when its message ends and depends on nothing after it, and the text
 * never ends with anything a later turn would not have at that position (no generation-prompt
 * marker), so appending messages only appends bytes. A string content and a single text part
 * serialize the same, as do absent, null and "" content. Canonical JSON = jansson compact with
 * sorted keys (JSON_COMPACT | JSON_SORT_KEYS).
 *
 * Chat (/v1/chat/completions): the tools (and legacy `functions`) sorted by function name (ties
 * by canonical JSON), then every message in order: role, name, tool_call_id, content parts in
 * order (text parts: "text", "input_text", "output_text" or a bare string; anything else, e.g.
 * image_url, input_audio, file, as a digest), then assistant tool_calls (name, arguments as
 * sent; legacy function_call likewise). Not included: reasoning, refusal, ids of tool calls.
 *
 * Completions (/v1/completions), the prompt, never collapsed to a count:
 *   string                   its bytes, unframed (so text prompts share prefixes naturally);
 *   [int, ...] token ids     US then each id in decimal followed by a space ("\x1f1 2 3 "): the
 *                            trailing space keeps [1,2] from being a prefix of [1,23];
 *   [elem, ...] a batch      the elements joined by RS, each a string or a token array as
 *                            above. A one-element batch equals its element. The engine caches
 *                            each element on its own, but one request goes to one worker, so
 *                            routing on the first element's prefix (it leads the text) is what
 *                            matters; the rest only refine the key.
 * Responses (/v1/responses): "#instructions" record, then the tools as for chat, then `input`:
 * a string as a "user" record; items in order: messages (role + content parts as for chat:
 * input_text/output_text are text, input_image/input_file/... digests), function_call (name,
 * arguments), function_call_output (call_id, output), any other item as a digest.
 * `previous_response_id` is not part of the text: such a request pins to the worker that
 * produced that response (kvr_route_previous_response_id()).
 * Anthropic Messages (/v1/messages): the chat text of the request's chat form
 * (routing/anthropic.h), as the engine converts it before applying the chat template: the
 * tools sorted by name (name, description, input_schema as canonical JSON), the system prompt
 * as a "system" record, then every message: text and thinking blocks as 'c', image and
 * document as the digest of {type, source}, tool_use as a tool call (name, canonical input),
 * tool_result as a "tool" record (tool_use_id as 'i', its text or blocks). cache_control
 * markers are dropped before anything is written, so moving them changes nothing.
 * /v1/messages/count_tokens has the same text, but kvroute routes it without keys (it is
 * answered without touching the KV cache, so it must teach nothing).
 *
 * The other endpoints (embeddings, rerank, score, tokenize, pooling, classify) route by their
 * input text, serialized as a completions prompt (a string raw, token ids and batches framed as
 * above): a chat-style `messages` list (embeddings, pooling, classify, tokenize) as for chat,
 * else their text fields in order, joined by RS when more than one is present:
 *   embeddings, pooling, classify: `input`;    tokenize: `prompt`;    detokenize: `tokens`;
 *   rerank (/v1/rerank, /rerank): `query`, `documents`;    score: `text_1`, `text_2`.
 * So requests embedding the same document, or reranking against the same query, share a
 * prefix; a field that is neither a string nor an array counts by its canonical JSON.
 */
#ifndef KVR_ROUTING_KEYS_H
#define KVR_ROUTING_KEYS_H
#include <jansson.h>
#include <stddef.h>

#include "util/buf.h"

/** The endpoints kvroute routes by the `model` of their JSON body (defined here once; api
 *  dispatches on it, proxy forwards to its path, routing keys read its body). Clients and
 *  workers use the same path (kvr_endpoint_path()). */
typedef enum kvr_endpoint {
    KVR_EP_CHAT = 0,         /**< POST /v1/chat/completions */
    KVR_EP_COMPLETIONS = 1,  /**< POST /v1/completions */
    KVR_EP_RESPONSES = 2,    /**< POST /v1/responses */
    KVR_EP_MESSAGES = 3,     /**< POST /v1/messages (Anthropic) */
    KVR_EP_COUNT_TOKENS = 4, /**< POST /v1/messages/count_tokens (Anthropic), passed through */
    KVR_EP_EMBEDDINGS,       /**< POST /v1/embeddings */
    KVR_EP_RERANK,           /**< POST /v1/rerank (Jina/Cohere shape, as vLLM serves it) */
    KVR_EP_RERANK_BARE,      /**< POST /rerank (vLLM's unversioned path, same body) */
    KVR_EP_SCORE,            /**< POST /v1/score */
    KVR_EP_TOKENIZE,         /**< POST /tokenize (vLLM; `model` optional) */
    KVR_EP_DETOKENIZE,       /**< POST /detokenize (vLLM; `model` optional) */
    KVR_EP_POOLING,          /**< POST /pooling */
    KVR_EP_CLASSIFY,         /**< POST /classify */
    KVR_EP_COUNT             /**< how many there are */
} kvr_endpoint;

/** The path of `ep` ("/v1/embeddings"), as clients send it and workers serve it. */
const char *kvr_endpoint_path(kvr_endpoint ep);
/** The endpoint served at `path` (exact match): 0 and `*ep`, or -1 when none is. */
int kvr_endpoint_find(const char *path, kvr_endpoint *ep);
/** 1 for the endpoints that generate text (chat, completions, responses, messages): their
 *  replies teach, their token usage limits rates. */
int kvr_endpoint_generates(kvr_endpoint ep);
/** 1 when a worker computes (and so may cache) the KV of the request's input: every
 *  endpoint but tokenize, detokenize and count_tokens, which only run the tokenizer, so what
 *  they carry is never taught as held by the worker. */
int kvr_endpoint_fills_cache(kvr_endpoint ep);
/** 1 when a request may omit `model` (tokenize, detokenize): it then goes to the only
 *  route, if there is exactly one. */
int kvr_endpoint_model_optional(kvr_endpoint ep);
/** The routing-key functions' name for the same enum. */
typedef kvr_endpoint kvr_route_kind;
#define KVR_ROUTE_CHAT KVR_EP_CHAT
#define KVR_ROUTE_COMPLETIONS KVR_EP_COMPLETIONS
#define KVR_ROUTE_RESPONSES KVR_EP_RESPONSES
#define KVR_ROUTE_MESSAGES KVR_EP_MESSAGES

/** Session keys longer than this many bytes are replaced by the 32-hex-digit XXH3-128 digest
 *  of their bytes (DESIGN §10: never rejected). */
#define KVR_SESSION_KEY_MAX 256
/** Most entries in a session-key source list. */
#define KVR_SESSION_SOURCES_MAX 16
/** Longest header name or body path in a source list, bytes. */
#define KVR_SESSION_SOURCE_NAME_MAX 63

/** The default source list (DESIGN §5), in the syntax of kvr_session_sources_parse(). Agent
 *  clients' own ids come after the generic session headers and before the user id: Claude
 *  Code's `x-claude-code-session-id`, `x-session-affinity` (used by gateways such as
 *  OpenRouter's), a bare `session_id` header; in the body, OpenAI's `prompt_cache_key` (its
 *  documented cache-routing hint), then Anthropic's `metadata.user_id` (Claude Code puts its
 *  session there), before `user`. */
#define KVR_SESSION_SOURCES_DEFAULT                                                              \
    "header:x-session-id,header:x-conversation-id,header:x-claude-code-session-id,"              \
    "header:x-session-affinity,header:session_id,header:x-user-id,"                              \
    "body:session_params.session_id,body:session_id,body:conversation_id,"                       \
    "body:prompt_cache_key,body:metadata.user_id,body:user,body:user_id"

/** One place a session key may come from. */
typedef struct kvr_session_source {
    int header;                                   /**< 1 = request header, 0 = body path */
    char name[KVR_SESSION_SOURCE_NAME_MAX + 1];   /**< lowercase header name, or dotted path
                                                       into nested body objects */
} kvr_session_source;

/** Ordered list of sources: the first one present gives the session key. */
typedef struct kvr_session_sources {
    size_t n;
    kvr_session_source src[KVR_SESSION_SOURCES_MAX];
} kvr_session_sources;

/** Fills `out` with KVR_SESSION_SOURCES_DEFAULT. */
void kvr_session_sources_default(kvr_session_sources *out);

/** Parses a comma-separated list of `header:NAME` / `body:PATH` entries (spaces around entries
 *  ignored; header names lowercased; PATH like `session_params.session_id`). Per-request ids
 *  (`x-request-id`, `x-trace-id`, `x-correlation-id`) are refused: they would make every
 *  request its own session. Returns 0, or -1 with a message in `err` (`errlen` bytes, may be
 *  0) and `out` unchanged. */
int kvr_session_sources_parse(kvr_session_sources *out, const char *spec, char *err,
                              size_t errlen);

/** Header accessor: returns the value of request header `name` (lowercase; the accessor
 *  matches case-insensitively) and its length in `*len`, or NULL when absent. The value is
 *  used as sent (no percent-decoding, no trimming) and must stay valid during the call. */
typedef const char *(*kvr_header_get_fn)(void *ctx, const char *name, size_t *len);

/** Appends the session key value `p` (`n` bytes) to `out`: as it is, or as its 32-hex-digit
 *  digest when longer than KVR_SESSION_KEY_MAX. Returns 0, or -1 (cap or memory; `out`
 *  unchanged). */
int kvr_session_key_append(kvr_buf *out, const char *p, size_t n);

/** Appends the session key to `out` (normally empty): the first source present in `src` with
 *  a non-empty value. Header values are used as sent. A body value that is a string counts by
 *  its decoded bytes; null counts as absent; any other JSON value counts by its canonical JSON
 *  text (`"user": 42` → "42"). An empty string means no session: the next source is tried.
 *  Keys over KVR_SESSION_KEY_MAX bytes become their hex digest. `get` may be NULL (no
 *  headers); `body` may be NULL or a non-object. Returns 1 when a key was appended, 0 when
 *  there is none, -1 when `out`'s cap was too small or memory ran out (`out` unchanged). */
int kvr_session_key_build(const json_t *body, kvr_header_get_fn get, void *ctx,
                          const kvr_session_sources *src, kvr_buf *out);

/** Appends the routing text of `body` for endpoint `kind` to `out`. When `out`'s cap is
 *  reached the text is cut there: a cut text is still a byte prefix of the full one, so the
 *  prefix property survives (later turns are cut at the same length). Malformed fields are
 *  never an error here (validation is the API layer's job): they count by their canonical JSON
 *  or are skipped. Returns 0, 1 when the text was cut at the cap, -1 out of memory (`out` then
 *  holds a prefix of the text). routing/text_scan.h builds the same chat and completions
 *  text from a body's scan, without a tree. */
int kvr_route_text_build(const json_t *body, kvr_route_kind kind, kvr_buf *out);

/** Both keys at once: kvr_session_key_build() into `session` then kvr_route_text_build() into
 *  `text`. Returns -1 if either failed for lack of memory, 1 if the text was cut at its cap,
 *  else 0. `session->len == 0` afterwards means the request has no session. */
int kvr_route_keys_build(const json_t *body, kvr_route_kind kind, kvr_header_get_fn get,
                         void *ctx, const kvr_session_sources *src, kvr_buf *text,
                         kvr_buf *session);

/** The Responses API `previous_response_id` of `body` (a non-empty string), borrowed from the
 *  body (valid while it lives), length in `*len`; NULL when absent. The request must go to the
 *  worker that produced that response: it alone holds its state. */
/** Bytes of routing text `text` (len bytes) before the first user message's own bytes: the
 *  tools, the system prompt and the framing every conversation opening the same way shares.
 *  A request whose best match stops there starts a new conversation rather than continuing or
 *  repeating one. 0 when the text has no user record (completions, or no user message). */
size_t kvr_route_text_preamble(const char *text, size_t len);

/** Completion teaching: appends a worker's reply to the routing text `text` of the request
 *  it answered, exactly as the next turn will frame it (so the next turn's text starts with
 *  the result). Chat and Responses: `reply` is the assistant message ({"role": "assistant",
 *  "content", "tool_calls"?}), appended as one more message record. Messages: `reply` is
 *  the assistant message in Anthropic's form ({"role": "assistant", "content": [blocks]}),
 *  appended as the next request will frame it. Completions: `reply` is the completion
 *  string, appended as raw bytes, and only to a string prompt (a client continuing a text
 *  prompt sends prompt + completion + more). Respects text's cap (a cut
 *  text stays a prefix). Returns 1 when appended, 0 when nothing applies, -1 out of memory. */
int kvr_route_text_append_reply(kvr_buf *text, kvr_route_kind kind, const json_t *reply);
/** kvr_route_text_append_reply() for a reply that is text alone, without building it: the
 *  same bytes as for {"role": "assistant", "content": s} (chat, Responses) or the string `s`
 *  (completions). `s` must be valid UTF-8 (as a JSON string holds); else nothing is appended
 *  (returns 0), as when jansson refuses such a string. Not for Messages (returns 0). Same
 *  returns as kvr_route_text_append_reply(). */
int kvr_route_text_append_reply_text(kvr_buf *text, kvr_route_kind kind, const char *s,
                                     size_t n);

const char *kvr_route_previous_response_id(const json_t *body, size_t *len);

/** The response id in a worker's Responses API answer: `id` of a non-streamed answer (an
 *  object with "object": "response"), or `response.id` of a streamed event (response.created,
 *  response.in_progress, response.completed...). Borrowed from `answer`; NULL when absent. Teach
 *  it (id → worker) into a kvr_session_map used as the pin map. */
const char *kvr_route_response_id(const json_t *answer, size_t *len);

#endif
