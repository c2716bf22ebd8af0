/* kvroute-sim endpoints: request parsing, admission (faults, delay), streaming the engine's
 * tokens back as OpenAI (or Anthropic) JSON/SSE. Response JSON is written by hand on the hot
 * path (jansson only parses requests). The four generation endpoints share everything up to
 * the engine; only their output writers differ. */
#include "api.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "embed.h"
#include "reqlog.h"
#include "respstore.h"
#include "routing/anthropic.h"
#include "template.h"
#include "tokenizer.h"
#include "util/json_read.h"
#include "util/log.h"
#include "util/oai_error.h"
#include "util/time.h"

#define JSON_TYPE "application/json"
#define METRICS_CAP (16u << 20)
#define DETOK_CAP (16u << 20) /* detokenized text; its JSON must fit the 64 MiB scratch */

struct kvr_sim_api {
    uv_loop_t *loop;
    kvr_sim_api_cfg cfg;
    char *model;
    kvr_sim_engine *eng; /* the data-parallel ranks (engine.h) */
    size_t neng;
    kvr_sim_dp dp;
    kvr_sim_faults *faults;
    kvr_sim_pd *pd;
    kvr_sim_reqlog *log;
    kvr_metrics *reg;
    kvr_sim_pieces *pieces;        /* NULL with --detokenize-cache-entries 0 */
    kvr_sim_resp_store *responses;
    size_t ndelayed;
    uint64_t next_id;
    kvr_buf scratch;
};

enum { K_COMPLETION, K_CHAT, K_RESPONSE, K_MESSAGE };

/* What a /v1/responses request adds. */
typedef struct resp_extra {
    json_t *instructions, *prev; /* strings from the request (referenced), or NULL */
    int store;
    uint64_t counter;            /* of the response id in the store */
    uint32_t *conv;              /* to store at the end: input ids, output ids, <|eot_id|> */
    size_t nconv, conv_cap;
    char msg_id[48];
    uint64_t seqno;              /* sequence_number of the next stream event */
} resp_extra;

/* One generation request, from arrival to the end of its response. It is freed once the HTTP
 * request is released, the engine no longer knows it and its delay timer is closed. */
typedef struct sim_req {
    kvr_sim_api *api;
    kvr_sim_engine *eng; /* the rank serving it */
    kvr_http_req *http;
    kvr_sim_seq *seq;
    uv_timer_t timer;
    int timer_open, delayed;
    int kind, stream, include_usage, fail, stalled, in_cb;
    uint32_t *tokens; /* until submitted */
    size_t ntok, max_tokens;
    kvr_buf text; /* output text, when the response needs it at the end */
    char id[48];
    char *xrid; /* the client's x-request-id, echoed */
    int64_t created;
    long events;
    uint64_t arrival_ns, last_token_ns, gen_seed;
    resp_extra *rx; /* K_RESPONSE only */
    /* prefill/decode (pd.h) */
    kvr_sim_xfer_params xp;   /* what the request asked of the transfer */
    kvr_sim_pd_part part;     /* the part this sim plays in it */
    uint32_t *prompt;         /* prefill: the prompt, to hold its blocks at the first token */
    int held;                 /* prefill: the hold was attempted */
    long held_blocks;         /* prefill: blocks held; -2: parameters dropped (fault) */
    kvr_buf kvparams;         /* prefill: the answer's kv_transfer_params object */
    kvr_sim_pd_fetch *fetch;  /* decode: the transfer, then the blocks it holds */
    int fetch_pending;        /* decode: waiting for the transfer before the engine */
    int xfer_result;          /* decode: 0 none, 1 fetched, 2 failed (recomputed) */
    size_t xfer_blocks;
    json_t *log;              /* its /sim/requests entry (a reference), or NULL */
} sim_req;

/* ---- small writers ---- */

static int put_json_str(kvr_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    int rc = kvr_buf_append(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        rc |= kvr_buf_append(b, s + run, i - run);
        char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        if (c == '"' || c == '\\') {
            esc[1] = (char)c;
            rc |= kvr_buf_append(b, esc, 2);
        } else if (c == '\n') {
            rc |= kvr_buf_append(b, "\\n", 2);
        } else {
            rc |= kvr_buf_append(b, esc, 6);
        }
        run = i + 1;
    }
    rc |= kvr_buf_append(b, s + run, n - run);
    return rc | kvr_buf_append(b, "\"", 1);
}

static int put_u64(kvr_buf *b, uint64_t v)
{
    char tmp[24];
    int i = 24;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return kvr_buf_append(b, tmp + i, (size_t)(24 - i));
}

/* A JSON string value from the request, or null. */
static int put_jstr_or_null(kvr_buf *b, const json_t *s)
{
    return s ? put_json_str(b, json_string_value(s), json_string_length(s))
             : kvr_buf_puts(b, "null");
}

/* Bytes of `s` to quote in an error message: at most `max`, not ending inside a character
 * (the error body must stay UTF-8). */
static int quote_len(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--;
    }
    return (int)n;
}

static void send_json(kvr_http_req *req, int status, const kvr_buf *b, const char *xrid)
{
    kvr_http_header h[1];
    size_t nh = 0;
    if (xrid) {
        h[0] = (kvr_http_header){"x-request-id", 12, xrid, strlen(xrid)};
        nh = 1;
    }
    kvr_http_resp_simple(req, status, JSON_TYPE, h, nh, b->data ? b->data : "", b->len);
}

/* A finished non-streaming generation: x-request-id (echoed) and the request's model-time
 * timings, so a client can read what the GPU would show whatever the time scale:
 * x-sim-model-ttft-ms (arrival to first token), x-sim-model-e2e-ms (arrival to the last
 * token) and x-sim-preemptions. */
static void send_finished_json(sim_req *r, const kvr_buf *b, const kvr_sim_seq_info *in)
{
    kvr_http_req *req = r->http;
    const char *xrid = r->xrid;
    char ttft[32], e2e[32], pre[16];
    double now = kvr_sim_sched_model_us(r->eng->sched);
    snprintf(ttft, sizeof(ttft), "%.3f", (in->first_token_model_us - in->arrival_model_us) / 1e3);
    snprintf(e2e, sizeof(e2e), "%.3f", (now - in->arrival_model_us) / 1e3);
    snprintf(pre, sizeof(pre), "%u", (unsigned)in->preemptions);
    kvr_http_header h[4] = {
        {"x-sim-model-ttft-ms", 19, ttft, strlen(ttft)},
        {"x-sim-model-e2e-ms", 18, e2e, strlen(e2e)},
        {"x-sim-preemptions", 17, pre, strlen(pre)},
    };
    size_t nh = 3;
    if (xrid)
        h[nh++] = (kvr_http_header){"x-request-id", 12, xrid, strlen(xrid)};
    kvr_http_resp_simple(req, 200, JSON_TYPE, h, nh, b->data ? b->data : "", b->len);
}

static void send_error_ex(kvr_http_req *req, int status, const char *msg, const char *param,
                          const char *code, const kvr_http_header *extra, size_t nextra)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_error_json_for(&b, kvr_http_req_path(req), status, NULL, msg, param, code) < 0)
        kvr_buf_reset(&b);
    kvr_http_resp_simple(req, status, JSON_TYPE, extra, nextra, b.data ? b.data : "", b.len);
    kvr_buf_free(&b);
}

static void send_error(kvr_http_req *req, int status, const char *msg, const char *param)
{
    send_error_ex(req, status, msg, param, NULL, NULL, 0);
}

/* ---- request lifetime ---- */

static void free_rx(resp_extra *x)
{
    if (!x)
        return;
    json_decref(x->instructions);
    json_decref(x->prev);
    free(x->conv);
    free(x);
}

/* Ends the transfer side of a request: a pending fetch is cancelled, fetched blocks held for
 * it are released. */
static void end_fetch(sim_req *r)
{
    kvr_sim_pd_fetch_end(r->fetch);
    r->fetch = NULL;
    r->fetch_pending = 0;
}

static void maybe_free(sim_req *r)
{
    if (r->http || r->seq || r->timer_open || r->in_cb || r->fetch_pending)
        return;
    end_fetch(r);
    kvr_sim_xfer_params_free(&r->xp);
    free(r->prompt);
    kvr_buf_free(&r->kvparams);
    json_decref(r->log);
    free(r->tokens);
    free(r->xrid);
    kvr_buf_free(&r->text);
    free_rx(r->rx);
    free(r);
}

static void abort_seq(sim_req *r)
{
    if (r->seq) {
        kvr_sim_sched_abort(r->eng->sched, r->seq);
        r->seq = NULL;
    }
}

static void on_timer_closed(uv_handle_t *h)
{
    sim_req *r = h->data;
    r->timer_open = 0;
    maybe_free(r);
}

static void stop_timer(sim_req *r)
{
    if (r->delayed) {
        r->delayed = 0;
        r->api->ndelayed--;
    }
    if (r->timer_open && !uv_is_closing((uv_handle_t *)&r->timer)) {
        uv_timer_stop(&r->timer);
        uv_close((uv_handle_t *)&r->timer, on_timer_closed);
    }
}

static void on_client_gone(void *ud)
{
    sim_req *r = ud;
    if (r->fetch_pending)
        end_fetch(r);
    abort_seq(r);
    stop_timer(r);
    if (r->http) {
        kvr_http_resp_abort(r->http);
        r->http = NULL;
    }
    maybe_free(r);
}

/* Closes the connection mid-response (--drop-after-events) and stops the sequence. */
static void drop(sim_req *r)
{
    abort_seq(r);
    if (r->http) {
        kvr_http_resp_abort(r->http);
        r->http = NULL;
    }
}

/* Writes one SSE event: `b` holds `data: <json>`, possibly after an `event:` line (the blank
 * line is added here). The stall/drop faults are applied first: they count events already
 * written. */
static void sse_send(sim_req *r, kvr_buf *b)
{
    const kvr_sim_faults *f = r->api->faults;
    if (!r->http || r->stalled)
        return;
    if (f->drop_after_events >= 0 && r->events >= f->drop_after_events) {
        drop(r);
        return;
    }
    if (f->stall_after_events >= 0 && r->events >= f->stall_after_events) {
        r->stalled = 1;
        return;
    }
    if (kvr_buf_append(b, "\n\n", 2) < 0)
        return;
    kvr_http_resp_write(r->http, b->data, b->len);
    r->events++;
}

static void end_stream(sim_req *r)
{
    if (r->http && !r->stalled) {
        kvr_http_resp_end(r->http);
        r->http = NULL;
    }
}

/* ---- chat and text completions output ---- */

/* `data: {"id":…,"object":…,"created":…,"model":…,"choices":[` */
static int chunk_head(sim_req *r, kvr_buf *b)
{
    kvr_sim_api *api = r->api;
    kvr_buf_reset(b);
    int rc = kvr_buf_puts(b, "data: {\"id\":\"");
    rc |= kvr_buf_puts(b, r->id);
    rc |= kvr_buf_puts(b, r->kind == K_CHAT
                              ? "\",\"object\":\"chat.completion.chunk\",\"created\":"
                              : "\",\"object\":\"text_completion\",\"created\":");
    rc |= put_u64(b, (uint64_t)r->created);
    rc |= kvr_buf_puts(b, ",\"model\":");
    rc |= put_json_str(b, api->model, strlen(api->model));
    rc |= kvr_buf_puts(b, ",\"choices\":[");
    return rc;
}

static int put_usage(kvr_buf *b, size_t prompt, size_t completion, size_t cached)
{
    int rc = kvr_buf_puts(b, "\"usage\":{\"prompt_tokens\":");
    rc |= put_u64(b, prompt);
    rc |= kvr_buf_puts(b, ",\"total_tokens\":");
    rc |= put_u64(b, prompt + completion);
    rc |= kvr_buf_puts(b, ",\"completion_tokens\":");
    rc |= put_u64(b, completion);
    rc |= kvr_buf_puts(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    rc |= put_u64(b, cached);
    return rc | kvr_buf_puts(b, "}}");
}

static void chunk_token(sim_req *r, size_t idx, const char *piece, size_t n, int last)
{
    int chat = r->kind == K_CHAT;
    kvr_buf *b = &r->api->scratch;
    if (idx == 0 && chat) {
        chunk_head(r, b);
        kvr_buf_puts(b, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                        "\"logprobs\":null,\"finish_reason\":null}]}");
        sse_send(r, b);
    }
    chunk_head(r, b);
    kvr_buf_puts(b, chat ? "{\"index\":0,\"delta\":{\"content\":" : "{\"index\":0,\"text\":");
    put_json_str(b, piece, n);
    kvr_buf_puts(b, chat ? "}," : ",");
    kvr_buf_puts(b, last ? "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}"
                         : "\"logprobs\":null,\"finish_reason\":null}]}");
    sse_send(r, b);
}

static void finish_stream(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_buf *b = &r->api->scratch;
    if (r->include_usage) {
        chunk_head(r, b);
        kvr_buf_puts(b, "],");
        put_usage(b, in->prompt_tokens, in->output_tokens, in->cached_tokens);
        kvr_buf_puts(b, "}");
        sse_send(r, b);
    }
    kvr_buf_reset(b);
    kvr_buf_puts(b, "data: [DONE]");
    sse_send(r, b);
    end_stream(r);
}

static void finish_json(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_sim_api *api = r->api;
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"id\":\"");
    kvr_buf_puts(b, r->id);
    kvr_buf_puts(b, r->kind == K_CHAT ? "\",\"object\":\"chat.completion\",\"created\":"
                                      : "\",\"object\":\"text_completion\",\"created\":");
    put_u64(b, (uint64_t)r->created);
    kvr_buf_puts(b, ",\"model\":");
    put_json_str(b, api->model, strlen(api->model));
    if (r->kind == K_CHAT) {
        kvr_buf_puts(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                        "\"content\":");
        put_json_str(b, r->text.data ? r->text.data : "", r->text.len);
        kvr_buf_puts(b, ",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"length\","
                        "\"stop_reason\":null}],");
    } else {
        kvr_buf_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
        put_json_str(b, r->text.data ? r->text.data : "", r->text.len);
        kvr_buf_puts(b, ",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null,"
                        "\"prompt_logprobs\":null}],");
    }
    if (r->kvparams.len) { /* top level of the completion, as vLLM's prefill answers */
        kvr_buf_puts(b, "\"kv_transfer_params\":");
        kvr_buf_append(b, r->kvparams.data, r->kvparams.len);
        kvr_buf_puts(b, ",");
    }
    put_usage(b, in->prompt_tokens, in->output_tokens, in->cached_tokens);
    if (kvr_buf_puts(b, "}") < 0) {
        send_error(r->http, 500, "response too large", NULL);
    } else {
        send_finished_json(r, b, in);
    }
    r->http = NULL;
}

/* ---- /v1/responses output ---- */

/* {"type":"output_text","text":…,"annotations":[]} */
static int put_text_part(kvr_buf *b, const kvr_buf *text)
{
    int rc = kvr_buf_puts(b, "{\"type\":\"output_text\",\"text\":");
    rc |= put_json_str(b, text->data ? text->data : "", text->len);
    return rc | kvr_buf_puts(b, ",\"annotations\":[]}");
}

/* The assistant message item; its text part only once the output is complete. */
static int put_message_item(sim_req *r, kvr_buf *b, int done)
{
    int rc = kvr_buf_puts(b, "{\"id\":\"");
    rc |= kvr_buf_puts(b, r->rx->msg_id);
    rc |= kvr_buf_puts(b, done ? "\",\"type\":\"message\",\"status\":\"completed\""
                               : "\",\"type\":\"message\",\"status\":\"in_progress\"");
    rc |= kvr_buf_puts(b, ",\"role\":\"assistant\",\"content\":[");
    if (done)
        rc |= put_text_part(b, &r->text);
    return rc | kvr_buf_puts(b, "]}");
}

static int put_resp_usage(kvr_buf *b, const kvr_sim_seq_info *in)
{
    int rc = kvr_buf_puts(b, "{\"input_tokens\":");
    rc |= put_u64(b, in->prompt_tokens);
    rc |= kvr_buf_puts(b, ",\"input_tokens_details\":{\"cached_tokens\":");
    rc |= put_u64(b, in->cached_tokens);
    rc |= kvr_buf_puts(b, "},\"output_tokens\":");
    rc |= put_u64(b, in->output_tokens);
    rc |= kvr_buf_puts(b, ",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":");
    rc |= put_u64(b, in->prompt_tokens + in->output_tokens);
    return rc | kvr_buf_puts(b, "}");
}

/* The response object: in progress (`in` NULL: no output, usage null) or completed. */
static int put_response(sim_req *r, kvr_buf *b, const kvr_sim_seq_info *in)
{
    const resp_extra *x = r->rx;
    int rc = kvr_buf_puts(b, "{\"id\":\"");
    rc |= kvr_buf_puts(b, r->id);
    rc |= kvr_buf_puts(b, "\",\"object\":\"response\",\"created_at\":");
    rc |= put_u64(b, (uint64_t)r->created);
    rc |= kvr_buf_puts(b, in ? ",\"status\":\"completed\"" : ",\"status\":\"in_progress\"");
    rc |= kvr_buf_puts(b, ",\"error\":null,\"incomplete_details\":null,\"instructions\":");
    rc |= put_jstr_or_null(b, x->instructions);
    rc |= kvr_buf_puts(b, ",\"max_output_tokens\":");
    rc |= put_u64(b, r->max_tokens);
    rc |= kvr_buf_puts(b, ",\"model\":");
    rc |= put_json_str(b, r->api->model, strlen(r->api->model));
    rc |= kvr_buf_puts(b, ",\"output\":[");
    if (in)
        rc |= put_message_item(r, b, 1);
    rc |= kvr_buf_puts(b, "],\"previous_response_id\":");
    rc |= put_jstr_or_null(b, x->prev);
    rc |= kvr_buf_puts(b, x->store ? ",\"store\":true,\"usage\":" : ",\"store\":false,\"usage\":");
    rc |= in ? put_resp_usage(b, in) : kvr_buf_puts(b, "null");
    return rc | kvr_buf_puts(b, "}");
}

/* `event: <type>` and `data: {"type":<type>,"sequence_number":N` in the scratch buffer; the
 * caller adds the event's fields, then event_send(). */
static kvr_buf *event_head(sim_req *r, const char *type)
{
    kvr_buf *b = &r->api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "event: ");
    kvr_buf_puts(b, type);
    kvr_buf_puts(b, "\ndata: {\"type\":\"");
    kvr_buf_puts(b, type);
    kvr_buf_puts(b, "\",\"sequence_number\":");
    put_u64(b, r->rx->seqno++);
    return b;
}

static void event_send(sim_req *r, kvr_buf *b)
{
    if (kvr_buf_puts(b, "}") == 0)
        sse_send(r, b);
}

/* `,"item_id":…,"output_index":0,"content_index":0` */
static void put_item_ref(sim_req *r, kvr_buf *b)
{
    kvr_buf_puts(b, ",\"item_id\":\"");
    kvr_buf_puts(b, r->rx->msg_id);
    kvr_buf_puts(b, "\",\"output_index\":0,\"content_index\":0");
}

static void resp_stream_start(sim_req *r)
{
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (size_t i = 0; i < 2; i++) {
        kvr_buf *b = event_head(r, types[i]);
        kvr_buf_puts(b, ",\"response\":");
        put_response(r, b, NULL);
        event_send(r, b);
    }
}

static void resp_stream_token(sim_req *r, size_t idx, const char *piece, size_t n)
{
    kvr_buf *b;
    if (idx == 0) {
        b = event_head(r, "response.output_item.added");
        kvr_buf_puts(b, ",\"output_index\":0,\"item\":");
        put_message_item(r, b, 0);
        event_send(r, b);
        b = event_head(r, "response.content_part.added");
        put_item_ref(r, b);
        kvr_buf_puts(b, ",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}");
        event_send(r, b);
    }
    b = event_head(r, "response.output_text.delta");
    put_item_ref(r, b);
    kvr_buf_puts(b, ",\"delta\":");
    put_json_str(b, piece, n);
    kvr_buf_puts(b, ",\"logprobs\":[]");
    event_send(r, b);
}

static void resp_finish_stream(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_buf *b = event_head(r, "response.output_text.done");
    put_item_ref(r, b);
    kvr_buf_puts(b, ",\"text\":");
    put_json_str(b, r->text.data ? r->text.data : "", r->text.len);
    kvr_buf_puts(b, ",\"logprobs\":[]");
    event_send(r, b);
    b = event_head(r, "response.content_part.done");
    put_item_ref(r, b);
    kvr_buf_puts(b, ",\"part\":");
    put_text_part(b, &r->text);
    event_send(r, b);
    b = event_head(r, "response.output_item.done");
    kvr_buf_puts(b, ",\"output_index\":0,\"item\":");
    put_message_item(r, b, 1);
    event_send(r, b);
    b = event_head(r, "response.completed");
    kvr_buf_puts(b, ",\"response\":");
    put_response(r, b, in);
    event_send(r, b);
    end_stream(r); /* no [DONE]: Responses streams end with response.completed */
}

static void resp_finish_json(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_buf *b = &r->api->scratch;
    kvr_buf_reset(b);
    if (put_response(r, b, in) < 0)
        send_error(r->http, 500, "response too large", NULL);
    else
        send_finished_json(r, b, in);
    r->http = NULL;
}

/* ---- /v1/messages output (Anthropic) ---- */

/* Anthropic's input_tokens leaves the cached tokens out; an engine's prefix cache creates no
 * separately billed cache entries, so cache_creation_input_tokens is 0. */
static int put_msg_usage(kvr_buf *b, const kvr_sim_seq_info *in, size_t output)
{
    int rc = kvr_buf_puts(b, "{\"input_tokens\":");
    rc |= put_u64(b, in->prompt_tokens - in->cached_tokens);
    rc |= kvr_buf_puts(b, ",\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":");
    rc |= put_u64(b, in->cached_tokens);
    rc |= kvr_buf_puts(b, ",\"output_tokens\":");
    rc |= put_u64(b, output);
    return rc | kvr_buf_puts(b, "}");
}

/* The message object: as message_start carries it (no content yet, output_tokens 1, as
 * Anthropic sends), or complete. The sim always generates max_tokens tokens. */
static int put_message(sim_req *r, kvr_buf *b, const kvr_sim_seq_info *in, int done)
{
    int rc = kvr_buf_puts(b, "{\"id\":\"");
    rc |= kvr_buf_puts(b, r->id);
    rc |= kvr_buf_puts(b, "\",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    rc |= put_json_str(b, r->api->model, strlen(r->api->model));
    rc |= kvr_buf_puts(b, ",\"content\":[");
    if (done) {
        rc |= kvr_buf_puts(b, "{\"type\":\"text\",\"text\":");
        rc |= put_json_str(b, r->text.data ? r->text.data : "", r->text.len);
        rc |= kvr_buf_puts(b, "}");
    }
    rc |= kvr_buf_puts(b, done ? "],\"stop_reason\":\"max_tokens\""
                               : "],\"stop_reason\":null");
    rc |= kvr_buf_puts(b, ",\"stop_sequence\":null,\"usage\":");
    rc |= put_msg_usage(b, in, done ? in->output_tokens : 1);
    return rc | kvr_buf_puts(b, "}");
}

/* `event: <type>` and `data: {"type":<type>` in the scratch buffer; the caller adds the
 * event's fields, then event_send(). */
static kvr_buf *msg_event(sim_req *r, const char *type)
{
    kvr_buf *b = &r->api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "event: ");
    kvr_buf_puts(b, type);
    kvr_buf_puts(b, "\ndata: {\"type\":\"");
    kvr_buf_puts(b, type);
    kvr_buf_puts(b, "\"");
    return b;
}

/* message_start and content_block_start go with the first token: message_start's usage
 * needs the prefix-cache hit, known once the engine admitted the prompt. */
static void msg_stream_token(sim_req *r, const kvr_sim_seq_info *in, size_t idx,
                             const char *piece, size_t n)
{
    kvr_buf *b;
    if (idx == 0) {
        b = msg_event(r, "message_start");
        kvr_buf_puts(b, ",\"message\":");
        put_message(r, b, in, 0);
        event_send(r, b);
        b = msg_event(r, "content_block_start");
        kvr_buf_puts(b, ",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}");
        event_send(r, b);
    }
    b = msg_event(r, "content_block_delta");
    kvr_buf_puts(b, ",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":");
    put_json_str(b, piece, n);
    kvr_buf_puts(b, "}");
    event_send(r, b);
}

static void msg_finish_stream(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_buf *b = msg_event(r, "content_block_stop");
    kvr_buf_puts(b, ",\"index\":0");
    event_send(r, b);
    b = msg_event(r, "message_delta");
    kvr_buf_puts(b, ",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},"
                    "\"usage\":{\"output_tokens\":");
    put_u64(b, in->output_tokens);
    kvr_buf_puts(b, "}");
    event_send(r, b);
    event_send(r, msg_event(r, "message_stop"));
    end_stream(r);
}

static void msg_finish_json(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_buf *b = &r->api->scratch;
    kvr_buf_reset(b);
    if (put_message(r, b, in, 1) < 0)
        send_error(r->http, 500, "response too large", NULL);
    else
        send_finished_json(r, b, in);
    r->http = NULL;
}

/* Stored before the answer is written, so a client that sends the follow-up (or GETs it) as
 * soon as it has read the answer always finds it. The ids are what the template renders for
 * the assistant message: its header ended the prompt, then the output, then <|eot_id|>; the
 * object is the completed response as the answer carries it. */
static void store_response(sim_req *r, const kvr_sim_seq_info *in)
{
    resp_extra *x = r->rx;
    if (!x->conv)
        return;
    x->conv[x->nconv++] = KVR_SIM_TOK_EOT;
    kvr_buf b;
    kvr_buf_init(&b, 0);
    char *json = put_response(r, &b, in) == 0 ? strndup(b.data, b.len) : NULL;
    kvr_buf_free(&b);
    kvr_sim_resp_store_put(r->api->responses, x->counter, x->conv, x->nconv, json);
    x->conv = NULL;
}

/* ---- engine callbacks ---- */

static void token_metrics(sim_req *r, kvr_sim_seq *seq, size_t idx)
{
    uint64_t now = kvr_now_ns();
    if (idx == 0) {
        const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
        uint64_t adm = in->admitted_ns ? in->admitted_ns : now;
        kvr_sim_vmetrics_first_token(r->eng->vm, (double)(now - r->arrival_ns) / 1e9,
                                     (double)(adm - in->arrival_ns) / 1e9, in->prompt_tokens);
    } else {
        kvr_sim_vmetrics_token(r->eng->vm, (double)(now - r->last_token_ns) / 1e9);
    }
    r->last_token_ns = now;
}

/* Prefill side: the prompt is computed (first token), so its blocks are held for the decode. */
static void hold_prompt(sim_req *r)
{
    r->held = 1;
    r->held_blocks = kvr_sim_pd_hold(r->api->pd, &r->xp, r->id, r->eng, r->prompt, r->ntok,
                                     &r->kvparams);
    free(r->prompt);
    r->prompt = NULL;
    if (r->log)
        json_object_set_new(r->log, "kv_transfer",
                            json_pack("{s:s,s:I,s:b}", "role", "prefill", "held_blocks",
                                      (json_int_t)(r->held_blocks > 0 ? r->held_blocks : 0),
                                      "params_dropped", r->held_blocks == -2));
}

static void on_token(void *ud, kvr_sim_seq *seq, uint32_t id, size_t idx, int last)
{
    sim_req *r = ud;
    token_metrics(r, seq, idx);
    if (idx == 0 && r->part == KVR_SIM_PD_PREFILL && !r->held)
        hold_prompt(r);
    resp_extra *x = r->rx;
    if (x && x->conv && x->nconv < x->conv_cap - 1) /* the last slot is for <|eot_id|> */
        x->conv[x->nconv++] = id;
    if (!r->http)
        return;
    const char *piece;
    size_t n;
    kvr_sim_gen_token(r->gen_seed, idx, &piece, &n);
    if (!r->stream || r->kind == K_RESPONSE)
        kvr_buf_append(&r->text, piece, n);
    if (!r->stream)
        return;
    r->in_cb = 1;
    if (r->kind == K_RESPONSE)
        resp_stream_token(r, idx, piece, n);
    else if (r->kind == K_MESSAGE)
        msg_stream_token(r, kvr_sim_seq_get_info(seq), idx, piece, n);
    else
        chunk_token(r, idx, piece, n, last);
    r->in_cb = 0;
    maybe_free(r); /* a drop fault released everything */
}

static void log_finished(sim_req *r, const kvr_sim_seq_info *in);

static void on_finish(void *ud, kvr_sim_seq *seq)
{
    sim_req *r = ud;
    const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
    r->seq = NULL; /* freed by the engine when this returns */
    kvr_sim_vmetrics_finished(r->eng->vm, (double)(kvr_now_ns() - r->arrival_ns) / 1e9);
    log_finished(r, in);
    if (r->rx)
        store_response(r, in);
    r->in_cb = 1;
    if (r->http && !r->stalled) {
        if (r->kind == K_RESPONSE && r->stream)
            resp_finish_stream(r, in);
        else if (r->kind == K_RESPONSE)
            resp_finish_json(r, in);
        else if (r->kind == K_MESSAGE && r->stream)
            msg_finish_stream(r, in);
        else if (r->kind == K_MESSAGE)
            msg_finish_json(r, in);
        else if (r->stream)
            finish_stream(r, in);
        else
            finish_json(r, in);
    }
    r->in_cb = 0;
    maybe_free(r); /* a stalled response stays until the client leaves */
}

static const kvr_sim_seq_cbs seq_cbs = {on_token, on_finish};

/* The usage into the request's /sim/requests entry, and for a prefill/decode request one log
 * line saying what the transfer did and what was cached. */
static void log_finished(sim_req *r, const kvr_sim_seq_info *in)
{
    if (r->log)
        json_object_set_new(r->log, "usage",
                            json_pack("{s:I,s:I,s:I}", "prompt_tokens",
                                      (json_int_t)in->prompt_tokens, "completion_tokens",
                                      (json_int_t)in->output_tokens, "cached_tokens",
                                      (json_int_t)in->cached_tokens));
    if (r->part == KVR_SIM_PD_NONE)
        return;
    static const char *const xr[] = {"none", "fetched", "failed"};
    KVR_INFO("msg=\"request finished\" id=%s request_id=\"%s\" rank=%d pd=%s kv_transfer=%s "
             "kv_blocks=%zu recomputed=%s prompt_tokens=%zu cached_tokens=%zu",
             r->id, r->xrid ? r->xrid : "", r->eng->rank,
             r->part == KVR_SIM_PD_PREFILL ? "prefill" : "decode",
             r->part == KVR_SIM_PD_PREFILL ? (r->held_blocks >= 0    ? "held"
                                              : r->held_blocks == -2 ? "dropped"
                                                                     : "none")
                                           : xr[r->xfer_result],
             r->part == KVR_SIM_PD_PREFILL ? (size_t)(r->held_blocks > 0 ? r->held_blocks : 0)
                                           : r->xfer_blocks,
             r->xfer_result == 2 ? "true" : "false", in->prompt_tokens, in->cached_tokens);
}

/* ---- admission ---- */

static void start_sse(sim_req *r)
{
    kvr_http_header h[3] = {
        {"Content-Type", 12, "text/event-stream; charset=utf-8", 32},
        {"Cache-Control", 13, "no-cache", 8},
        {"x-request-id", 12, r->xrid ? r->xrid : "", r->xrid ? strlen(r->xrid) : 0},
    };
    kvr_http_resp_start(r->http, 200, h, r->xrid ? 3 : 2, -1);
    if (r->kind == K_RESPONSE)
        resp_stream_start(r);
}

static void submit(sim_req *r);

/* Decode side: the transfer ended (pd.h); the request goes to the engine either way, with the
 * fetched blocks cached or to recompute them. */
static void on_xfer_done(void *ud, const kvr_sim_pd_result *res)
{
    sim_req *r = ud;
    r->fetch_pending = 0;
    r->xfer_result = res->fetched ? 1 : 2;
    r->xfer_blocks = res->blocks;
    if (r->log)
        json_object_set_new(r->log, "kv_transfer",
                            json_pack("{s:s,s:s,s:I,s:s?,s:b}", "role", "decode", "result",
                                      res->fetched ? "fetched" : "failed", "blocks",
                                      (json_int_t)res->blocks, "reason", res->reason,
                                      "recomputed", !res->fetched));
    if (!r->http) { /* cannot happen: a client that leaves cancels the transfer */
        maybe_free(r);
        return;
    }
    submit(r);
}

static void admit(sim_req *r)
{
    kvr_sim_api *api = r->api;
    const kvr_sim_faults *f = api->faults;
    if (r->fail) {
        send_error_ex(r->http, f->fail_status, "injected failure (kvroute-sim --fail-rate)", NULL,
                      "injected_failure", NULL, 0);
        r->http = NULL;
        maybe_free(r);
        return;
    }
    if (r->stream) {
        start_sse(r);
        if (!r->http) { /* a drop fault hit the first events */
            maybe_free(r);
            return;
        }
    } else if (f->drop_after_events == 0) {
        drop(r); /* no response at all */
        maybe_free(r);
        return;
    } else if (f->stall_after_events == 0) {
        r->stalled = 1; /* generate, but never answer */
    }
    if (r->part == KVR_SIM_PD_DECODE) {
        r->fetch = kvr_sim_pd_fetch_start(api->pd, &r->xp, r->xrid ? r->xrid : r->id, r->eng,
                                          r->tokens, r->ntok, on_xfer_done, r);
        if (r->fetch) {
            r->fetch_pending = 1;
            return; /* on_xfer_done submits */
        }
        r->xfer_result = 2; /* out of memory: recompute */
    }
    submit(r);
}

/* Hands the prompt to the engine. */
static void submit(sim_req *r)
{
    if (r->part == KVR_SIM_PD_PREFILL && !(r->prompt = malloc(r->ntok * sizeof(uint32_t))))
        r->part = KVR_SIM_PD_NONE; /* out of memory: a plain request */
    if (r->prompt)
        memcpy(r->prompt, r->tokens, r->ntok * sizeof(uint32_t));
    uint32_t *t = r->tokens;
    r->tokens = NULL;
    r->seq = kvr_sim_sched_submit(r->eng->sched, t, r->ntok, r->max_tokens, &seq_cbs, r);
    if (!r->seq) {
        if (r->stream) {
            drop(r);
        } else {
            send_error(r->http, 503, "out of memory", NULL);
            r->http = NULL;
        }
        maybe_free(r);
        return;
    }
    r->gen_seed = kvr_sim_seq_gen_seed(r->seq);
}

static void on_delay(uv_timer_t *t)
{
    sim_req *r = t->data;
    stop_timer(r);
    admit(r);
}

/* The failure draw, the client's callbacks, then the --delay-ms timer or admission. */
static void start_req(sim_req *r)
{
    kvr_sim_api *api = r->api;
    r->fail = kvr_sim_faults_should_fail(api->faults);
    kvr_http_req_cbs cbs = {NULL, on_client_gone};
    kvr_http_req_set_cbs(r->http, &cbs, r);
    if (api->faults->delay_ms > 0) {
        uv_timer_init(api->loop, &r->timer);
        r->timer.data = r;
        r->timer_open = 1;
        r->delayed = 1;
        api->ndelayed++;
        uv_timer_start(&r->timer, on_delay, api->faults->delay_ms, 0);
    } else {
        admit(r);
    }
}

/* ---- request fields ---- */

/* Reads an optional positive integer field: 1 = set, 0 = absent/null, -1 = invalid. */
static int get_count(const json_t *o, const char *k, size_t *out)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return -1;
    *out = (size_t)json_integer_value(v);
    return 1;
}

/* Reads an optional boolean: its value, `dflt` when absent or null, -1 for another type. */
static int get_bool(const json_t *o, const char *k, int dflt)
{
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return dflt;
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

static json_t *parse_body(kvr_http_req *req)
{
    size_t len;
    const char *body = kvr_http_req_body(req, &len);
    json_error_t jerr;
    json_t *j = kvr_json_read(body, len, &jerr); /* = json_loadb(…, 0, …), ~10× faster */
    if (!j) {
        char msg[256];
        snprintf(msg, sizeof(msg), "invalid JSON body: %s (line %d, column %d)", jerr.text,
                 jerr.line, jerr.column);
        send_error(req, 400, msg, NULL);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        send_error(req, 400, "the request body must be a JSON object", NULL);
        return NULL;
    }
    return j;
}

/* 404 for another model name, as vLLM's check_model(). Returns 0 when fine. */
static int check_model(kvr_sim_api *api, kvr_http_req *req, const json_t *j)
{
    const json_t *m = json_object_get(j, "model");
    if (!m || json_is_null(m) || (json_is_string(m) && strcmp(json_string_value(m), api->model) == 0))
        return 0;
    const char *name = json_is_string(m) ? json_string_value(m) : "(not a string)";
    char msg[512];
    snprintf(msg, sizeof(msg), "The model `%.*s` does not exist.", quote_len(name, 300), name);
    send_error_ex(req, 404, msg, "model", "model_not_found", NULL, 0);
    return -1;
}

/* The fields every generation endpoint reads: model, stream, n (not in Responses) and the
 * output length, named max_completion_tokens/max_tokens (chat), max_tokens (completions) or
 * max_output_tokens (responses). Returns 0, or -1 after sending the error. */
static int read_gen_fields(kvr_sim_api *api, kvr_http_req *req, const json_t *j, int kind,
                           int *stream, size_t *max_tokens)
{
    if (check_model(api, req, j) < 0)
        return -1;
    *stream = get_bool(j, "stream", 0);
    if (*stream < 0) {
        send_error(req, 400, "'stream' must be a boolean", "stream");
        return -1;
    }
    size_t n = 1;
    if ((kind == K_CHAT || kind == K_COMPLETION) && (get_count(j, "n", &n) < 0 || n != 1)) {
        send_error(req, 400, "kvroute-sim supports only n = 1", "n");
        return -1;
    }
    *max_tokens = api->cfg.default_max_tokens;
    const char *field = kind == K_RESPONSE ? "max_output_tokens" : "max_tokens";
    int got = kind == K_CHAT ? get_count(j, "max_completion_tokens", max_tokens) : 0;
    if (got < 0)
        field = "max_completion_tokens";
    else if (got == 0)
        got = get_count(j, field, max_tokens);
    if (got < 0) {
        char msg[80];
        snprintf(msg, sizeof(msg), "%s must be an integer of at least 1", field);
        send_error(req, 400, msg, field);
        return -1;
    }
    return 0;
}

/* The chat form's prompt, shared by /v1/chat/completions and /tokenize so that both give the
 * ids the engine caches. add_special_tokens (default false) adds a BOS before the template's
 * own, as vLLM does with Llama 3's template. */
static int render_chat_req(const json_t *j, kvr_sim_toks *toks, const char **err,
                           const char **param)
{
    int agp = get_bool(j, "add_generation_prompt", 1);
    int ast = get_bool(j, "add_special_tokens", 0);
    if (agp < 0 || ast < 0) {
        *param = agp < 0 ? "add_generation_prompt" : "add_special_tokens";
        *err = agp < 0 ? "'add_generation_prompt' must be a boolean"
                       : "'add_special_tokens' must be a boolean";
        return -1;
    }
    if (ast)
        kvr_sim_toks_push(toks, KVR_SIM_TOK_BOS);
    return kvr_sim_render_chat(toks, json_object_get(j, "messages"), json_object_get(j, "tools"),
                               agp, err, param);
}

/* 400 for a rendering error, 503 when memory ran out. Returns 0 when the prompt is fine. */
static int render_status(kvr_http_req *req, int rc, const kvr_sim_toks *toks, const char *err,
                         const char *param)
{
    if (rc < 0)
        send_error(req, 400, err, param);
    else if (toks->oom)
        send_error(req, 503, "out of memory", NULL);
    return rc < 0 || toks->oom ? -1 : 0;
}

/* The engine's limits for a prompt of `p` tokens plus `max_tokens`: vLLM's context-length
 * 400, a request the pool can never hold, a full queue. Returns 0 or -1 (error sent). */
static int check_limits(kvr_sim_api *api, const kvr_sim_engine *e, kvr_http_req *req, size_t p,
                        size_t max_tokens, const char *param)
{
    char msg[400];
    if (p + max_tokens > api->cfg.max_model_len || p + max_tokens < p) {
        snprintf(msg, sizeof(msg),
                 "This model's maximum context length is %u tokens. However, you requested %zu "
                 "tokens (%zu in the messages, %zu in the completion). Please reduce the length "
                 "of the messages or completion.",
                 api->cfg.max_model_len, p + max_tokens, p, max_tokens);
        send_error(req, 400, msg, param);
        return -1;
    }
    if (!kvr_sim_sched_fits(e->sched, p + max_tokens)) {
        snprintf(msg, sizeof(msg),
                 "the request needs %zu tokens of KV cache but the cache holds only %zu "
                 "(--kv-blocks × --block-size)",
                 p + max_tokens,
                 (size_t)kvr_sim_kv_num_blocks(e->kv) * kvr_sim_kv_block_size(e->kv));
        send_error(req, 400, msg, "max_tokens");
        return -1;
    }
    if (kvr_sim_sched_num_waiting(e->sched) + api->ndelayed >= api->cfg.max_waiting) {
        kvr_http_header ra = {"Retry-After", 11, "1", 1};
        send_error_ex(req, 503, "too many requests waiting (--max-waiting)", NULL, NULL, &ra, 1);
        return -1;
    }
    return 0;
}

/* ids: unique per process, reproducible with --seed (splitmix64 of a counter) */
static void make_id(kvr_sim_api *api, const char *prefix, char *out, size_t cap)
{
    uint64_t z = api->cfg.seed + ++api->next_id * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)z,
             (unsigned long long)api->next_id);
}

/* The request's /sim/requests entry (reqlog.h); NULL when the log is off. */
static json_t *log_entry(kvr_sim_api *api, const sim_req *r)
{
    if (!api->cfg.request_log_size)
        return NULL;
    const char *dp = kvr_http_req_header(r->http, KVR_SIM_DP_HEADER);
    json_t *e = json_pack("{s:s,s:s?,s:s?,s:i,s:I,s:b,s:I}", "path", kvr_http_req_path(r->http),
                          "request_id", r->xrid, "x_data_parallel_rank", dp, "rank",
                          r->eng->rank, "max_tokens", (json_int_t)r->max_tokens, "stream",
                          r->stream, "prompt_tokens", (json_int_t)r->ntok);
    kvr_sim_reqlog_add(api->log, e);
    return e;
}

/* A request holding the prompt taken from `toks` (with room for the output, as the engine
 * wants). NULL after sending a 503. */
static sim_req *new_req(kvr_sim_api *api, kvr_sim_engine *e, kvr_http_req *req,
                        kvr_sim_toks *toks, size_t max_tokens, int kind, int stream)
{
    size_t p = toks->total;
    sim_req *r = calloc(1, sizeof(*r));
    uint32_t *t = kvr_sim_toks_take(toks);
    uint32_t *t2 = t ? realloc(t, (p + max_tokens) * sizeof(uint32_t)) : NULL;
    const char *xrid = kvr_http_req_header(req, "x-request-id");
    if (!r || !t2) {
        free(r);
        free(t2 ? t2 : t);
        send_error(req, 503, "out of memory", NULL);
        return NULL;
    }
    r->api = api;
    r->eng = e;
    r->http = req;
    r->tokens = t2;
    r->ntok = p;
    r->max_tokens = max_tokens;
    r->kind = kind;
    r->stream = stream;
    r->xrid = xrid && *xrid ? strdup(xrid) : NULL;
    /* TTFT and e2e count from the complete request, like vLLM's arrival_time (a slow client
     * body upload is not the engine's latency) */
    r->arrival_ns = kvr_now_ns();
    r->created = kvr_unix_time();
    kvr_buf_init(&r->text, 0);
    kvr_buf_init(&r->kvparams, 0);
    if (kind != K_RESPONSE)
        make_id(api, kind == K_CHAT ? "chatcmpl-" : kind == K_MESSAGE ? "msg_" : "cmpl-", r->id,
                sizeof(r->id));
    r->log = log_entry(api, r);
    return r;
}

static void init_toks(kvr_sim_api *api, kvr_sim_toks *toks)
{
    kvr_sim_toks_init(toks, api->cfg.max_model_len);
    toks->seen = api->pieces;
}

/* The rank serving a generation request (dp.h), or NULL after a 400. */
static kvr_sim_engine *pick_engine(kvr_sim_api *api, kvr_http_req *req)
{
    char msg[200];
    long r = kvr_sim_dp_pick(&api->dp, kvr_http_req_header(req, KVR_SIM_DP_HEADER), msg,
                             sizeof(msg));
    if (r < 0) {
        send_error(req, 400, msg, NULL);
        return NULL;
    }
    return &api->eng[r];
}

/* ---- /v1/chat/completions, /v1/completions ---- */

static void completions(kvr_sim_api *api, kvr_http_req *req, int kind)
{
    kvr_sim_engine *e = pick_engine(api, req);
    json_t *j = e ? parse_body(req) : NULL;
    if (!j)
        return;
    int stream;
    size_t max_tokens;
    kvr_sim_toks toks;
    init_toks(api, &toks);
    kvr_sim_xfer_params xp = {0};
    char xerr[200];
    const char *xparam;
    if (read_gen_fields(api, req, j, kind, &stream, &max_tokens) < 0)
        goto out;
    if (kvr_sim_xfer_read_params(j, api->cfg.max_model_len, &xp, xerr, sizeof(xerr), &xparam) <
        0) {
        send_error(req, 400, xerr, xparam);
        goto out;
    }
    const char *err = NULL, *param = kind == K_CHAT ? NULL : "prompt";
    int rc = kind == K_CHAT ? render_chat_req(j, &toks, &err, &param)
                            : kvr_sim_render_completion(&toks, json_object_get(j, "prompt"), &err);
    if (render_status(req, rc, &toks, err, param) < 0 ||
        check_limits(api, e, req, toks.total, max_tokens, "messages") < 0)
        goto out;
    sim_req *r = new_req(api, e, req, &toks, max_tokens, kind, stream);
    if (r) {
        r->include_usage = json_is_true(
            json_object_get(json_object_get(j, "stream_options"), "include_usage"));
        r->xp = xp;
        xp.remote_block_ids = NULL;
        r->part = kvr_sim_pd_part_of(api->pd, &r->xp);
        if (r->log) {
            static const char *const keys[] = {"kv_transfer_params", "bootstrap_room",
                                               "bootstrap_host", "bootstrap_port"};
            static const char *const parts[] = {"none", "prefill", "decode"};
            for (size_t i = 0; i < 4; i++) {
                json_t *v = json_object_get(j, keys[i]);
                json_object_set(r->log, keys[i], v ? v : json_null());
            }
            json_object_set_new(r->log, "pd", json_string(parts[r->part]));
        }
        start_req(r);
    }
out:
    kvr_sim_xfer_params_free(&xp);
    kvr_sim_toks_free(&toks);
    json_decref(j);
}

/* ---- /v1/responses ---- */

/* A Responses content part as a chat part: text kinds become text parts, inputs of other
 * media are kept as given (the template hashes them into a media token). NULL: unsupported. */
static json_t *chat_part(const json_t *part)
{
    const char *type = json_string_value(json_object_get(part, "type"));
    if (!type)
        return NULL;
    const char *key = NULL;
    if (strcmp(type, "input_text") == 0 || strcmp(type, "output_text") == 0)
        key = "text";
    else if (strcmp(type, "refusal") == 0)
        key = "refusal";
    if (key) {
        json_t *text = json_object_get(part, key);
        return json_is_string(text) ? json_pack("{s:s,s:O}", "type", "text", "text", text) : NULL;
    }
    if (strcmp(type, "input_image") == 0 || strcmp(type, "input_file") == 0 ||
        strcmp(type, "input_audio") == 0)
        return json_incref((json_t *)part);
    return NULL;
}

static json_t *chat_content(const json_t *c, const char **err)
{
    if (json_is_string(c))
        return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        *err = "message content must be a string or an array of content parts";
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        json_t *p = chat_part(part);
        if (!p || json_array_append_new(out, p) < 0) {
            *err = "content parts must be input_text/output_text (with a string 'text'), "
                   "refusal, input_image, input_file or input_audio";
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

static json_t *chat_message(const json_t *item, const char **err)
{
    const json_t *type = json_object_get(item, "type");
    const json_t *role = json_object_get(item, "role");
    if (!json_is_object(item) || (type && !(json_is_string(type) &&
                                            strcmp(json_string_value(type), "message") == 0))) {
        *err = "kvroute-sim supports only message input items ({role, content})";
        return NULL;
    }
    if (!json_is_string(role)) {
        *err = "each message item needs a string 'role'";
        return NULL;
    }
    json_t *content = chat_content(json_object_get(item, "content"), err);
    return content ? json_pack("{s:O,s:o}", "role", role, "content", content) : NULL;
}

/* `input` (a string or an array of message items) as chat messages; NULL with `*err`. */
static json_t *input_messages(const json_t *input, const char **err)
{
    if (json_is_string(input))
        return json_pack("[{s:s,s:O}]", "role", "user", "content", input);
    if (!json_is_array(input)) {
        *err = "'input' must be a string or an array of message items";
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *item;
    json_array_foreach(input, i, item) {
        json_t *m = chat_message(item, err);
        if (!m || json_array_append_new(out, m) < 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* Reads instructions, previous_response_id and store. Returns NULL after sending a 400. */
static resp_extra *resp_fields(kvr_http_req *req, const json_t *j)
{
    static const char *const keys[] = {"instructions", "previous_response_id"};
    json_t *v[2];
    for (size_t i = 0; i < 2; i++) {
        v[i] = json_object_get(j, keys[i]);
        if (json_is_null(v[i]))
            v[i] = NULL;
        if (v[i] && !json_is_string(v[i])) {
            char msg[80];
            snprintf(msg, sizeof(msg), "'%s' must be a string", keys[i]);
            send_error(req, 400, msg, keys[i]);
            return NULL;
        }
    }
    int store = get_bool(j, "store", 1);
    resp_extra *x = store < 0 ? NULL : calloc(1, sizeof(*x));
    if (!x) {
        send_error(req, store < 0 ? 400 : 503,
                   store < 0 ? "'store' must be a boolean" : "out of memory", "store");
        return NULL;
    }
    x->instructions = json_incref(v[0]);
    x->prev = json_incref(v[1]);
    x->store = store;
    return x;
}

static void previous_not_found(kvr_http_req *req, const char *id)
{
    char msg[300];
    snprintf(msg, sizeof(msg), "Previous response with id '%.*s' not found.", quote_len(id, 200),
             id);
    send_error_ex(req, 404, msg, "previous_response_id", "previous_response_not_found", NULL, 0);
}

/* The prompt: BOS and tools, the instructions as a system message, the previous response's
 * conversation, the new input, the generation prompt. `*conv_start` is where the part to
 * store begins. Returns 0, or -1 after sending the error. */
static int resp_render(kvr_sim_api *api, kvr_http_req *req, const json_t *j,
                       const resp_extra *x, kvr_sim_toks *toks, size_t *conv_start)
{
    const uint32_t *prev = NULL;
    size_t nprev = 0;
    if (x->prev && !(prev = kvr_sim_resp_store_get(api->responses, json_string_value(x->prev),
                                                   &nprev))) {
        previous_not_found(req, json_string_value(x->prev));
        return -1;
    }
    const char *err = "'input' is required", *param = "input";
    const json_t *input = json_object_get(j, "input");
    json_t *msgs = input ? input_messages(input, &err) : NULL;
    json_t *sys = x->instructions ? json_pack("[{s:s,s:O}]", "role", "system", "content",
                                              x->instructions)
                                  : json_array();
    int rc = msgs && sys ? 0 : -1;
    if (msgs && !sys)
        err = "out of memory";
    if (rc == 0)
        rc = kvr_sim_render_chat_head(toks, json_object_get(j, "tools"), &err, &param);
    if (rc == 0)
        rc = kvr_sim_render_messages(toks, sys, &err, &param);
    *conv_start = toks->total;
    if (rc == 0 && nprev)
        kvr_sim_toks_append(toks, prev, nprev);
    if (rc == 0)
        rc = kvr_sim_render_messages(toks, msgs, &err, &param);
    if (rc == 0)
        kvr_sim_render_gen_prompt(toks);
    json_decref(msgs);
    json_decref(sys);
    if (param && strcmp(param, "tools") != 0)
        param = "input";
    return render_status(req, rc, toks, err, param);
}

/* Copies the conversation part of the prompt, with room for the output and <|eot_id|>. Only
 * after check_limits(), which bounds the size. Returns 0 or -1 (503 sent). */
static int resp_keep_conv(kvr_sim_api *api, kvr_http_req *req, resp_extra *x,
                          const kvr_sim_toks *toks, size_t start, size_t max_tokens)
{
    if (!x->store || api->cfg.max_stored_responses == 0)
        return 0;
    size_t n = toks->len - start;
    x->conv_cap = n + max_tokens + 1;
    x->conv = malloc(x->conv_cap * sizeof(uint32_t));
    if (!x->conv) {
        send_error(req, 503, "out of memory", NULL);
        return -1;
    }
    memcpy(x->conv, toks->ids + start, n * sizeof(uint32_t));
    x->nconv = n;
    return 0;
}

static void responses(kvr_sim_api *api, kvr_http_req *req)
{
    kvr_sim_engine *e = pick_engine(api, req);
    json_t *j = e ? parse_body(req) : NULL;
    if (!j)
        return;
    int stream;
    size_t max_tokens, start = 0;
    resp_extra *x = NULL;
    kvr_sim_toks toks;
    init_toks(api, &toks);
    if (read_gen_fields(api, req, j, K_RESPONSE, &stream, &max_tokens) < 0 ||
        !(x = resp_fields(req, j)) || resp_render(api, req, j, x, &toks, &start) < 0 ||
        check_limits(api, e, req, toks.total, max_tokens, "input") < 0 ||
        resp_keep_conv(api, req, x, &toks, start, max_tokens) < 0)
        goto out;
    sim_req *r = new_req(api, e, req, &toks, max_tokens, K_RESPONSE, stream);
    if (r) {
        r->rx = x;
        x = NULL;
        r->rx->counter = kvr_sim_resp_store_next_id(api->responses, r->id);
        make_id(api, "msg_", r->rx->msg_id, sizeof(r->rx->msg_id));
        start_req(r);
    }
out:
    free_rx(x);
    kvr_sim_toks_free(&toks);
    json_decref(j);
}

/* ---- /v1/messages, /v1/messages/count_tokens (Anthropic) ---- */

/* The prompt: the request's chat form (routing/anthropic.h, the conversion engines serving
 * /v1/messages apply) through the chat template, with the generation prompt. */
static int render_messages_req(const json_t *j, kvr_sim_toks *toks, const char **err,
                               const char **param)
{
    const json_t *m = json_object_get(j, "messages"), *sys = json_object_get(j, "system");
    *param = "messages";
    if (!json_is_array(m) || json_array_size(m) == 0) {
        *err = "'messages' must be a non-empty array";
        return -1;
    }
    if (sys && !json_is_null(sys) && !json_is_string(sys) && !json_is_array(sys)) {
        *err = "'system' must be a string or an array of text blocks";
        *param = "system";
        return -1;
    }
    json_t *chat = kvr_anthropic_to_chat(j);
    if (!chat) {
        toks->oom = 1;
        return 0;
    }
    int rc = kvr_sim_render_chat(toks, json_object_get(chat, "messages"),
                                 json_object_get(chat, "tools"), 1, err, param);
    json_decref(chat);
    return rc;
}

static void messages(kvr_sim_api *api, kvr_http_req *req)
{
    kvr_sim_engine *e = pick_engine(api, req);
    json_t *j = e ? parse_body(req) : NULL;
    if (!j)
        return;
    int stream;
    size_t max_tokens;
    const char *err = NULL, *param = NULL;
    kvr_sim_toks toks;
    init_toks(api, &toks);
    if (read_gen_fields(api, req, j, K_MESSAGE, &stream, &max_tokens) < 0)
        goto out;
    int rc = render_messages_req(j, &toks, &err, &param);
    if (render_status(req, rc, &toks, err, param) < 0 ||
        check_limits(api, e, req, toks.total, max_tokens, "messages") < 0)
        goto out;
    sim_req *r = new_req(api, e, req, &toks, max_tokens, K_MESSAGE, stream);
    if (r)
        start_req(r);
out:
    kvr_sim_toks_free(&toks);
    json_decref(j);
}

/* {"input_tokens": N}: the whole prompt, as the engine would render it for /v1/messages. */
static void count_tokens(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = parse_body(req);
    if (!j)
        return;
    const char *err = NULL, *param = NULL;
    kvr_sim_toks toks;
    init_toks(api, &toks);
    if (check_model(api, req, j) < 0)
        goto out;
    int rc = render_messages_req(j, &toks, &err, &param);
    if (render_status(req, rc, &toks, err, param) < 0)
        goto out;
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"input_tokens\":");
    put_u64(b, toks.total);
    kvr_buf_puts(b, "}");
    send_json(req, 200, b, NULL);
out:
    kvr_sim_toks_free(&toks);
    json_decref(j);
}

/* GET and DELETE /v1/responses/{id}: a stored response, as OpenAI serves them. */
static void stored_response(kvr_sim_api *api, kvr_http_req *req, const char *id)
{
    const char *meth = kvr_http_req_method(req);
    int del = strcmp(meth, "DELETE") == 0;
    if (!del && strcmp(meth, "GET") != 0 && strcmp(meth, "HEAD") != 0) {
        kvr_http_header h = {"Allow", 5, "GET, HEAD, DELETE", 17};
        send_error_ex(req, 405, "method not allowed", NULL, NULL, &h, 1);
        return;
    }
    const char *json = kvr_sim_resp_store_get_json(api->responses, id);
    if (!json) {
        char msg[300];
        snprintf(msg, sizeof(msg), "Response with id '%.*s' not found.", quote_len(id, 200), id);
        send_error(req, 404, msg, NULL);
        return;
    }
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    int rc = 0;
    if (del) {
        rc |= kvr_buf_puts(b, "{\"id\":");
        rc |= put_json_str(b, id, strlen(id));
        rc |= kvr_buf_puts(b, ",\"object\":\"response\",\"deleted\":true}");
        kvr_sim_resp_store_delete(api->responses, id);
    } else {
        rc = kvr_buf_puts(b, json);
    }
    if (rc == 0)
        send_json(req, 200, b, kvr_http_req_header(req, "x-request-id"));
    else
        send_error(req, 503, "out of memory", NULL);
}

/* ---- /v1/embeddings ---- */

/* encoding_format, dimensions and add_special_tokens. Returns 0, or -1 after a 400. */
static int embed_opts(kvr_sim_api *api, kvr_http_req *req, const json_t *j,
                      kvr_sim_embed_opts *o)
{
    *o = (kvr_sim_embed_opts){.model = api->model, .dim = KVR_SIM_EMBED_DIM,
                              .max_model_len = api->cfg.max_model_len, .seen = api->pieces};
    const json_t *f = json_object_get(j, "encoding_format");
    const char *fs = json_string_value(f);
    o->base64 = fs && strcmp(fs, "base64") == 0;
    if (f && !json_is_null(f) && !o->base64 && !(fs && strcmp(fs, "float") == 0)) {
        send_error(req, 400, "'encoding_format' must be \"float\" or \"base64\"",
                   "encoding_format");
        return -1;
    }
    if (get_count(j, "dimensions", &o->dim) < 0 || o->dim > KVR_SIM_EMBED_DIM_MAX) {
        char msg[80];
        snprintf(msg, sizeof(msg), "'dimensions' must be an integer in [1, %d]",
                 KVR_SIM_EMBED_DIM_MAX);
        send_error(req, 400, msg, "dimensions");
        return -1;
    }
    o->add_special_tokens = get_bool(j, "add_special_tokens", 1);
    if (o->add_special_tokens < 0) {
        send_error(req, 400, "'add_special_tokens' must be a boolean", "add_special_tokens");
        return -1;
    }
    return 0;
}

static void embeddings(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = parse_body(req);
    kvr_sim_embed_opts o;
    if (!j || check_model(api, req, j) < 0 || embed_opts(api, req, j, &o) < 0) {
        json_decref(j);
        return;
    }
    kvr_buf data, *b = &api->scratch;
    kvr_buf_init(&data, api->scratch.cap);
    size_t tokens = 0;
    uint64_t digest = 0;
    char msg[300];
    int rc = kvr_sim_embed_data(json_object_get(j, "input"), &o, &data, &tokens, &digest, msg,
                                sizeof(msg));
    json_decref(j);
    if (rc) {
        send_error(req, rc, rc == 400 ? msg : "out of memory or answer too large", "input");
        kvr_buf_free(&data);
        return;
    }
    /* The id follows from the inputs, so the same request gets the same answer (bar
     * `created`) from any sim serving the model. */
    char id[40];
    snprintf(id, sizeof(id), "embd-%016llx", (unsigned long long)digest);
    kvr_buf_reset(b);
    int e = kvr_buf_puts(b, "{\"id\":\"");
    e |= kvr_buf_puts(b, id);
    e |= kvr_buf_puts(b, "\",\"object\":\"list\",\"created\":");
    e |= put_u64(b, (uint64_t)kvr_unix_time());
    e |= kvr_buf_puts(b, ",\"model\":");
    e |= put_json_str(b, api->model, strlen(api->model));
    e |= kvr_buf_puts(b, ",\"data\":");
    e |= kvr_buf_append(b, data.data, data.len);
    e |= kvr_buf_puts(b, ",\"usage\":{\"prompt_tokens\":");
    e |= put_u64(b, tokens);
    e |= kvr_buf_puts(b, ",\"total_tokens\":");
    e |= put_u64(b, tokens);
    e |= kvr_buf_puts(b, ",\"completion_tokens\":0,\"prompt_tokens_details\":null}}");
    kvr_buf_free(&data);
    if (e == 0)
        send_json(req, 200, b, kvr_http_req_header(req, "x-request-id"));
    else
        send_error(req, 503, "out of memory or answer too large", NULL);
}

/* ---- /tokenize, /detokenize ---- */

/* Renders either form of a tokenize request. Returns 0, or -1 after sending the error. vLLM
 * does not check max_model_len here; the sim still caps what it stores (--max-model-len). */
static int tokenize_render(kvr_sim_api *api, kvr_http_req *req, const json_t *j,
                           kvr_sim_toks *toks)
{
    const char *err = NULL, *param = "prompt";
    const json_t *prompt = json_object_get(j, "prompt");
    int rc = 0;
    if (json_object_get(j, "messages")) {
        rc = render_chat_req(j, toks, &err, &param);
    } else if (json_is_string(prompt)) {
        int ast = get_bool(j, "add_special_tokens", 1);
        if (ast < 0) {
            rc = -1;
            err = "'add_special_tokens' must be a boolean";
            param = "add_special_tokens";
        } else {
            if (ast)
                kvr_sim_toks_push(toks, KVR_SIM_TOK_BOS);
            kvr_sim_tokenize(toks, json_string_value(prompt), json_string_length(prompt));
        }
    } else if (prompt) {
        rc = kvr_sim_render_completion(toks, prompt, &err);
    } else {
        rc = -1;
        err = "either 'prompt' or 'messages' is required";
    }
    if (render_status(req, rc, toks, err, param) < 0)
        return -1;
    if (toks->total > toks->len) {
        char msg[200];
        snprintf(msg, sizeof(msg), "the prompt has %zu tokens, more than max_model_len %u",
                 toks->total, api->cfg.max_model_len);
        send_error(req, 400, msg, param);
        return -1;
    }
    return 0;
}

/* token_strs: each id's own text (tokenizer.h), as vLLM's convert_ids_to_tokens. */
static int put_token_strs(kvr_sim_api *api, kvr_buf *b, const kvr_sim_toks *toks)
{
    kvr_buf one;
    kvr_buf_init(&one, 0);
    int rc = kvr_buf_puts(b, "[");
    for (size_t i = 0; i < toks->len && !rc; i++) {
        kvr_buf_reset(&one);
        rc |= i ? kvr_buf_append(b, ",", 1) : 0;
        rc |= kvr_sim_detokenize(api->pieces, toks->ids + i, 1, &one);
        rc |= put_json_str(b, one.data ? one.data : "", one.len);
    }
    kvr_buf_free(&one);
    return rc | kvr_buf_puts(b, "]");
}

static void reply_tokens(kvr_sim_api *api, kvr_http_req *req, const kvr_sim_toks *toks,
                         int strs)
{
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    int rc = kvr_buf_puts(b, "{\"count\":");
    rc |= put_u64(b, toks->len);
    rc |= kvr_buf_puts(b, ",\"max_model_len\":");
    rc |= put_u64(b, api->cfg.max_model_len);
    rc |= kvr_buf_puts(b, ",\"tokens\":[");
    for (size_t i = 0; i < toks->len; i++) {
        if (i)
            rc |= kvr_buf_append(b, ",", 1);
        rc |= put_u64(b, toks->ids[i]);
    }
    rc |= kvr_buf_puts(b, "],\"token_strs\":");
    rc |= strs ? put_token_strs(api, b, toks) : kvr_buf_puts(b, "null");
    if (rc == 0 && kvr_buf_puts(b, "}") == 0)
        send_json(req, 200, b, NULL);
    else
        send_error(req, 503, "out of memory", NULL);
}

static void tokenize(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = parse_body(req);
    if (!j)
        return;
    kvr_sim_toks toks;
    init_toks(api, &toks);
    int strs = get_bool(j, "return_token_strs", 0);
    if (check_model(api, req, j) == 0) {
        if (strs < 0)
            send_error(req, 400, "'return_token_strs' must be a boolean", "return_token_strs");
        else if (tokenize_render(api, req, j, &toks) == 0)
            reply_tokens(api, req, &toks, strs);
    }
    kvr_sim_toks_free(&toks);
    json_decref(j);
}

/* `tokens` as ids. Returns the array (caller frees), or NULL with a message in `msg`. */
static uint32_t *read_token_ids(const json_t *a, size_t *n, char *msg, size_t cap)
{
    if (!json_is_array(a)) {
        snprintf(msg, cap, a ? "'tokens' must be an array of token ids" : "'tokens' is required");
        return NULL;
    }
    *n = json_array_size(a);
    uint32_t *ids = malloc((*n ? *n : 1) * sizeof(*ids));
    if (!ids) {
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < *n; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)KVR_SIM_VOCAB) {
            if (json_is_integer(v))
                snprintf(msg, cap, "token id %lld is out of vocabulary (size %u)", (long long)id,
                         KVR_SIM_VOCAB);
            else
                snprintf(msg, cap, "token ids must be integers (item %zu is not)", i);
            free(ids);
            return NULL;
        }
        ids[i] = (uint32_t)id;
    }
    return ids;
}

static void detokenize(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = parse_body(req);
    if (!j)
        return;
    char msg[128];
    size_t n = 0;
    uint32_t *ids = NULL;
    if (check_model(api, req, j) < 0)
        goto out;
    if (!(ids = read_token_ids(json_object_get(j, "tokens"), &n, msg, sizeof(msg)))) {
        send_error(req, 400, msg, "tokens");
        goto out;
    }
    kvr_buf text, *b = &api->scratch;
    kvr_buf_init(&text, DETOK_CAP);
    kvr_buf_reset(b);
    int rc = kvr_sim_detokenize(api->pieces, ids, n, &text);
    rc |= kvr_buf_puts(b, "{\"prompt\":");
    rc |= put_json_str(b, text.data ? text.data : "", text.len);
    rc |= kvr_buf_puts(b, "}");
    kvr_buf_free(&text);
    if (rc == 0)
        send_json(req, 200, b, NULL);
    else
        send_error(req, 400, "the detokenized text is too long", "tokens");
out:
    free(ids);
    json_decref(j);
}

/* ---- other endpoints ---- */

static void models(kvr_sim_api *api, kvr_http_req *req)
{
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"object\":\"list\",\"data\":[{\"id\":");
    put_json_str(b, api->model, strlen(api->model));
    kvr_buf_puts(b, ",\"object\":\"model\",\"created\":");
    put_u64(b, (uint64_t)kvr_unix_time());
    kvr_buf_puts(b, ",\"owned_by\":\"vllm\",\"root\":");
    put_json_str(b, api->model, strlen(api->model));
    kvr_buf_puts(b, ",\"parent\":null,\"max_model_len\":");
    put_u64(b, api->cfg.max_model_len);
    kvr_buf_puts(b, ",\"permission\":[]}]}");
    send_json(req, 200, b, NULL);
}

static void metrics(kvr_sim_api *api, kvr_http_req *req)
{
    kvr_buf b;
    kvr_buf_init(&b, METRICS_CAP);
    if (kvr_metrics_render(api->reg, &b) < 0) {
        kvr_buf_free(&b);
        send_error(req, 500, "metrics exposition too large", NULL);
        return;
    }
    kvr_http_resp_simple(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, 0,
                         b.data ? b.data : "", b.len);
    kvr_buf_free(&b);
}

static void health(kvr_sim_api *api, kvr_http_req *req)
{
    int st = api->faults->health_status;
    if (st >= 200 && st < 300)
        kvr_http_resp_simple(req, st, NULL, NULL, 0, "", 0);
    else
        send_error(req, st, "unhealthy (kvroute-sim --health-status)", NULL);
}

/* Every rank's events out at once (reset and evict answer after their events are sent). */
static void flush_all(kvr_sim_api *api)
{
    for (size_t i = 0; i < api->neng; i++)
        if (api->eng[i].events)
            kvr_sim_events_flush_rank(api->eng[i].events, api->eng[i].ev_idx);
}

/* Resets every rank, as vLLM's reset_prefix_cache reaches every engine core; refused unless
 * all of them can (nothing in use anywhere), so the ranks never disagree. */
static void reset_cache(kvr_sim_api *api, kvr_http_req *req)
{
    for (size_t i = 0; i < api->neng; i++)
        if (kvr_sim_kv_num_used(api->eng[i].kv) > 0) {
            send_error(req, 409,
                       "cannot reset the prefix cache while requests hold blocks (vLLM refuses "
                       "too)",
                       NULL);
            return;
        }
    for (size_t i = 0; i < api->neng; i++)
        kvr_sim_kv_reset(api->eng[i].kv);
    flush_all(api); /* AllBlocksCleared goes out at once */
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"status\":\"ok\"}");
    send_json(req, 200, b, NULL);
}

static void evict_cache(kvr_sim_api *api, kvr_http_req *req)
{
    size_t n = 0;
    for (size_t i = 0; i < api->neng; i++)
        n += kvr_sim_kv_evict_free(api->eng[i].kv);
    flush_all(api); /* the BlockRemoved go out at once */
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"evicted\":");
    put_u64(b, n);
    kvr_buf_puts(b, "}");
    send_json(req, 200, b, NULL);
}

static void reply_json(kvr_http_req *req, int status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        send_error(req, 503, "out of memory", NULL);
        return;
    }
    kvr_http_resp_simple(req, status, JSON_TYPE, NULL, 0, s, strlen(s));
    free(s);
}

static void faults(kvr_sim_api *api, kvr_http_req *req, int post)
{
    if (post) {
        json_t *j = parse_body(req);
        if (!j)
            return;
        const char *err = NULL;
        int rc = kvr_sim_faults_update(api->faults, j, &err);
        json_decref(j);
        if (rc < 0) {
            send_error(req, 400, err, NULL);
            return;
        }
    }
    reply_json(req, 200, kvr_sim_faults_json(api->faults));
}

/* LMCache's status as kvroute's lmcache_aware polls it: the share of the pool holding cached
 * prefixes stands in for the share of LMCache's store in use. */
static void lmcache_status(kvr_sim_api *api, kvr_http_req *req)
{
    double cached = 0, total = 0;
    for (size_t i = 0; i < api->neng; i++) {
        cached += kvr_sim_kv_num_cached(api->eng[i].kv);
        total += kvr_sim_kv_num_blocks(api->eng[i].kv);
    }
    double occ = cached / total;
    reply_json(req, 200, json_pack("{s:f,s:b}", "occupancy", occ > 1 ? 1.0 : occ,
                                   "cache_available", 1));
}

/* One rank's engine counters; the publisher's only on the rank that owns it (with shared
 * KV events, rank 0), so that sums over ranks count each publisher once. */
static json_t *rank_stats(const kvr_sim_engine *e)
{
    const kvr_sim_events *ev = e->owns_events ? e->events : NULL;
    json_t *j = json_pack(
        "{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "rank", e->rank,
        "running", (json_int_t)kvr_sim_sched_num_running(e->sched), "waiting",
        (json_int_t)kvr_sim_sched_num_waiting(e->sched), "kv_blocks",
        (json_int_t)kvr_sim_kv_num_blocks(e->kv), "kv_blocks_used",
        (json_int_t)kvr_sim_kv_num_used(e->kv), "kv_blocks_cached",
        (json_int_t)kvr_sim_kv_num_cached(e->kv), "evictions",
        (json_int_t)kvr_sim_kv_evictions(e->kv), "prefix_cache_queries",
        (json_int_t)kvr_sim_sched_cache_queries(e->sched), "prefix_cache_hits",
        (json_int_t)kvr_sim_sched_cache_hits(e->sched), "preemptions",
        (json_int_t)kvr_sim_sched_preemptions(e->sched), "steps",
        (json_int_t)kvr_sim_sched_steps(e->sched), "kv_events_next_seq",
        (json_int_t)(ev ? kvr_sim_events_next_seq(ev) : 0), "kv_events_dropped",
        (json_int_t)(ev ? kvr_sim_events_dropped(ev) : 0), "model_us",
        kvr_sim_sched_model_us(e->sched));
    json_object_set_new(j, "kv_event_batches_dropped",
                        json_integer(ev ? (json_int_t)kvr_sim_events_batches_dropped(ev) : 0));
    json_object_set_new(j, "kv_events_replays_ignored",
                        json_integer(ev ? (json_int_t)kvr_sim_events_replays_ignored(ev) : 0));
    return j;
}

/* GET /sim/stats: the counters summed over the ranks (model_us: the furthest clock), and
 * each rank's own under "ranks". */
static void stats(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:s}", "model", api->model, "delayed",
                          (json_int_t)api->ndelayed, "block_size",
                          (json_int_t)kvr_sim_kv_block_size(api->eng[0].kv),
                          "data_parallel_size", (json_int_t)api->neng, "role",
                          kvr_sim_role_name(kvr_sim_pd_role(api->pd)));
    json_t *ranks = json_array();
    for (size_t i = 0; i < api->neng; i++) {
        json_t *r = rank_stats(&api->eng[i]);
        const char *k;
        json_t *v;
        json_object_foreach(r, k, v) {
            if (strcmp(k, "rank") == 0)
                continue;
            json_t *sum = json_object_get(j, k);
            if (json_is_real(v))
                json_object_set_new(j, k, json_real(sum && json_real_value(sum) > json_real_value(v)
                                                        ? json_real_value(sum)
                                                        : json_real_value(v)));
            else
                json_object_set_new(j, k, json_integer((sum ? json_integer_value(sum) : 0) +
                                                       json_integer_value(v)));
        }
        json_array_append_new(ranks, r);
    }
    json_object_set_new(j, "ranks", ranks);
    json_object_set_new(j, "stored_responses",
                        json_integer((json_int_t)kvr_sim_resp_store_count(api->responses)));
    json_object_set_new(j, "detokenize_pieces",
                        json_integer((json_int_t)kvr_sim_pieces_count(api->pieces)));
    const kvr_sim_sched_cfg *sc = kvr_sim_sched_get_cfg(api->eng[0].sched);
    json_object_set_new(
        j, "engine",
        json_pack("{s:s?,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f}", "profile", api->cfg.profile,
                  "max_num_seqs", (json_int_t)sc->max_num_seqs, "max_num_batched_tokens",
                  (json_int_t)sc->max_num_batched_tokens, "max_model_len",
                  (json_int_t)api->cfg.max_model_len, "step_overhead_us", sc->step_overhead_us,
                  "prefill_us_per_token", sc->prefill_us_per_token, "decode_us_per_token",
                  sc->decode_us_per_token, "decode_us_per_kv_token", sc->decode_us_per_kv_token,
                  "time_scale", sc->time_scale));
    reply_json(req, 200, j);
}

/* GET /sim/requests: the request log (reqlog.h), oldest first; POST clears it. */
static void requests_log(kvr_sim_api *api, kvr_http_req *req, int post)
{
    if (post) {
        kvr_sim_reqlog_clear(api->log);
        reply_json(req, 200, json_array());
        return;
    }
    reply_json(req, 200, kvr_sim_reqlog_list(api->log));
}

/* ---- dispatch ---- */

typedef enum { GET_ONLY, POST_ONLY, GET_POST } methods;

static int method_ok(kvr_http_req *req, methods m, int *is_post)
{
    const char *meth = kvr_http_req_method(req);
    int get = strcmp(meth, "GET") == 0 || strcmp(meth, "HEAD") == 0;
    int post = strcmp(meth, "POST") == 0;
    *is_post = post;
    if ((m == GET_ONLY && get) || (m == POST_ONLY && post) || (m == GET_POST && (get || post)))
        return 1;
    const char *allow = m == GET_ONLY ? "GET, HEAD" : m == POST_ONLY ? "POST" : "GET, HEAD, POST";
    kvr_http_header h = {"Allow", 5, allow, strlen(allow)};
    send_error_ex(req, 405, "method not allowed", NULL, NULL, &h, 1);
    return 0;
}

enum {
    R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS, R_EMBEDDINGS, R_TOKENIZE,
    R_DETOKENIZE, R_MODELS, R_HEALTH, R_METRICS, R_RESET, R_EVICT, R_FAULTS, R_LMCACHE, R_STATS,
    R_REQUESTS
};

static const struct route {
    const char *path;
    methods m;
    int id;
} routes[] = {
    {"/v1/chat/completions", POST_ONLY, R_CHAT},
    {"/v1/completions", POST_ONLY, R_COMPLETIONS},
    {"/v1/responses", POST_ONLY, R_RESPONSES},
    {"/v1/messages", POST_ONLY, R_MESSAGES},
    {"/v1/messages/count_tokens", POST_ONLY, R_COUNT_TOKENS},
    {"/v1/embeddings", POST_ONLY, R_EMBEDDINGS},
    {"/tokenize", POST_ONLY, R_TOKENIZE},
    {"/detokenize", POST_ONLY, R_DETOKENIZE},
    {"/v1/models", GET_ONLY, R_MODELS},
    {"/health", GET_ONLY, R_HEALTH},
    {"/metrics", GET_ONLY, R_METRICS},
    {"/sim/reset_prefix_cache", POST_ONLY, R_RESET},
    {"/reset_prefix_cache", POST_ONLY, R_RESET},
    {"/sim/evict", POST_ONLY, R_EVICT},
    {"/sim/faults", GET_POST, R_FAULTS},
    {"/sim/stats", GET_ONLY, R_STATS},
    {"/lmcache/status", GET_ONLY, R_LMCACHE},
    {"/sim/requests", GET_POST, R_REQUESTS},
};

static void serve(kvr_sim_api *api, kvr_http_req *req, int id, int post)
{
    switch (id) {
    case R_CHAT: completions(api, req, K_CHAT); break;
    case R_COMPLETIONS: completions(api, req, K_COMPLETION); break;
    case R_RESPONSES: responses(api, req); break;
    case R_MESSAGES: messages(api, req); break;
    case R_COUNT_TOKENS: count_tokens(api, req); break;
    case R_TOKENIZE: tokenize(api, req); break;
    case R_DETOKENIZE: detokenize(api, req); break;
    case R_EMBEDDINGS: embeddings(api, req); break;
    case R_MODELS: models(api, req); break;
    case R_HEALTH: health(api, req); break;
    case R_METRICS: metrics(api, req); break;
    case R_RESET: reset_cache(api, req); break;
    case R_EVICT: evict_cache(api, req); break;
    case R_FAULTS: faults(api, req, post); break;
    case R_LMCACHE: lmcache_status(api, req); break;
    case R_REQUESTS: requests_log(api, req, post); break;
    default: stats(api, req); break;
    }
}

void kvr_sim_api_handle(kvr_http_req *req, void *ud)
{
    kvr_sim_api *api = ud;
    const char *path = kvr_http_req_path(req);
    for (size_t i = 0; i < sizeof(routes) / sizeof(*routes); i++) {
        int post;
        if (strcmp(path, routes[i].path) != 0)
            continue;
        if (method_ok(req, routes[i].m, &post))
            serve(api, req, routes[i].id, post);
        return;
    }
    if (strncmp(path, "/v1/responses/", 14) == 0 && path[14] && !strchr(path + 14, '/')) {
        stored_response(api, req, path + 14);
        return;
    }
    static const char *const xfer[] = {"/sim/kv_transfer/", "/sim/bootstrap/"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(xfer[i]);
        if (strncmp(path, xfer[i], n) == 0 && path[n] && !strchr(path + n, '/')) {
            int post;
            if (method_ok(req, GET_ONLY, &post))
                kvr_sim_pd_serve(api->pd, req, path + n, i);
            return;
        }
    }
    send_error(req, 404, "not found", NULL);
}

kvr_sim_api *kvr_sim_api_new(uv_loop_t *loop, const kvr_sim_api_cfg *cfg, kvr_sim_engine *eng,
                             size_t neng, kvr_sim_pd *pd, kvr_sim_faults *faults,
                             kvr_metrics *reg)
{
    kvr_sim_api *api = calloc(1, sizeof(*api));
    if (!api)
        return NULL;
    api->model = strdup(cfg->model);
    api->pieces = kvr_sim_pieces_new(cfg->detokenize_cache_entries);
    api->responses = kvr_sim_resp_store_new(cfg->max_stored_responses, cfg->seed);
    api->log = kvr_sim_reqlog_new(cfg->request_log_size);
    if (!api->model || !api->responses || !api->log ||
        (cfg->detokenize_cache_entries && !api->pieces)) {
        kvr_sim_api_free(api);
        return NULL;
    }
    api->loop = loop;
    api->cfg = *cfg;
    api->cfg.model = api->model;
    api->eng = eng;
    api->neng = neng;
    api->dp.nranks = neng;
    api->pd = pd;
    api->faults = faults;
    api->reg = reg;
    kvr_buf_init(&api->scratch, 64u << 20);
    return api;
}

void kvr_sim_api_set_port(kvr_sim_api *api, int port)
{
    kvr_sim_resp_store_salt(api->responses, (uint64_t)port);
}

void kvr_sim_api_free(kvr_sim_api *api)
{
    if (!api)
        return;
    kvr_buf_free(&api->scratch);
    kvr_sim_pieces_free(api->pieces);
    kvr_sim_resp_store_free(api->responses);
    kvr_sim_reqlog_free(api->log);
    free(api->model);
    free(api);
}
