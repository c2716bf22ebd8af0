/* Reads token `usage` (and, for the Responses API, the response id) from a worker's response
 * as it streams past, for
 * kvroute_{prompt,cached,completion}_tokens_total (DESIGN §10): the JSON body's `usage`, or the
 * SSE chunk that carries one (the final chunk with stream_options.include_usage). Responses
 * API answers count input_tokens / input_tokens_details.cached_tokens / output_tokens, also
 * from the `response` object of a streamed response.completed event. Anthropic Messages
 * answers (kvr_usage_messages()) count from `usage` (JSON) or the message_start and
 * message_delta events: input_tokens excludes cached tokens there, so prompt = input_tokens +
 * cache_read_input_tokens + cache_creation_input_tokens, cached = cache_read_input_tokens,
 * completion = output_tokens; each field an event carries replaces the value an earlier event
 * gave (message_delta's counts are totals). SSE events split across reads are reassembled
 * before anything parses them. */
#ifndef KVR_PROXY_USAGE_H
#define KVR_PROXY_USAGE_H
#include <jansson.h>
#include <stddef.h>

#include "util/buf.h"

typedef struct kvr_usage {
    kvr_buf buf;        /**< JSON: body so far; SSE: the current incomplete line */
    int sse;            /**< 1 for text/event-stream */
    int overflow;       /**< the body or a line exceeded the cap: stop scanning */
    int skip_line;      /**< SSE: the current line exceeded the cap; drop bytes to its end */
    int found;          /**< a usage object was read */
    long long prompt;   /**< usage.prompt_tokens */
    long long cached;   /**< usage.prompt_tokens_details.cached_tokens */
    int has_cached;     /**< the worker reported cached_tokens (0 when absent) */
    long long completion; /**< usage.completion_tokens */
    int want_id;        /**< also look for the Responses API response id */
    char *response_id;  /**< the id found (owned; NULL until found) */
    size_t reply_cap;   /**< collect the reply up to this many bytes (0 = not at all) */
    int reply_over;     /**< the reply outgrew reply_cap (or memory ran out): not usable */
    kvr_buf reply;      /**< the reply's text so far */
    json_t *calls;      /**< its tool calls so far: array of {function: {name, arguments}};
                             Messages: its content blocks {type, name?, at}, each block's
                             bytes in `reply` from its `at` to the next block's */
    int reply_done;     /**< a complete reply was read (JSON body, or final SSE event) */
    int messages;       /**< an Anthropic Messages answer */
    long long msg_input, msg_cache_read, msg_cache_creation; /**< Messages: latest values */
} kvr_usage;

/** Tests only (fuzz/fuzz_sse.c): nonzero makes every event and body go through a jansson
 *  tree, the reference the in-place reading is checked against. 0 by default: a chat or
 *  completions answer with no tool calls, Responses fields or event type (token events, the
 *  final chunk's usage, a plain JSON body) is read where it lies, without a tree or an
 *  allocation (the reply's text is decoded straight into `reply`); a line wholly inside one
 *  read is not copied. */
extern int kvr_usage_tree_only;

/** Starts a scan; `cap` bytes bound the memory kept (0 disables scanning); `want_id` also
 *  captures the response id of a Responses API answer (routing/keys.h
 *  kvr_route_response_id()). */
void kvr_usage_init(kvr_usage *u, int sse, size_t cap, int want_id);
/** Also collects the reply (assistant text and tool calls) for completion teaching: chat
 *  choices[0].message / delta.content and delta.tool_calls (fragments joined by index),
 *  completions choices[0].text, Responses output_text (its final response object). Replies
 *  over `cap` bytes are dropped (reply_over). Call after kvr_usage_init(). */
void kvr_usage_want_reply(kvr_usage *u, size_t cap);
/** The reply as the next chat turn will send it: a new {"role": "assistant", "content",
 *  "tool_calls"?} object (caller decrefs); for completions a JSON string; for Messages
 *  {"role": "assistant", "content": [text and tool_use blocks]}. NULL when none was
 *  collected (not asked, over the cap, no answer, a tool input that is not JSON). */
json_t *kvr_usage_reply(const kvr_usage *u, int completions);
/** The reply when it is text alone (a chat, Responses or completions answer without tool
 *  calls): 1 with its bytes in `*s`, `*n` (owned by `u`), which kvr_usage_reply() would put
 *  in its "content" (or return as the completion string). 0 when there is none, or when it
 *  is more than text (tool calls, an Anthropic message): then use kvr_usage_reply(). */
int kvr_usage_reply_text(const kvr_usage *u, const char **s, size_t *n);
/** Reads the answer as Anthropic Messages (usage as above; the reply's text and tool_use
 *  blocks, in order). Call after kvr_usage_init(). */
void kvr_usage_messages(kvr_usage *u);
/** Feeds response body bytes. */
void kvr_usage_feed(kvr_usage *u, const char *data, size_t len);
/** Parses what is buffered (JSON bodies) at the end of the response. */
void kvr_usage_finish(kvr_usage *u);
/** Frees the buffer and the response id. */
void kvr_usage_free(kvr_usage *u);

#endif
