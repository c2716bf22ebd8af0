/* kvroute-sim endpoints: request parsing, admission (faults, delay), streaming the engine's
 * tokens back as OpenAI JSON/SSE. Response JSON is written by hand on the hot path (jansson
 * only parses requests). */
#include "api.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_read.h"
#include "template.h"
#include "tokenizer.h"
#include "util/log.h"
#include "util/oai_error.h"
#include "util/time.h"

#define JSON_TYPE "application/json"
#define METRICS_CAP (16u << 20)

struct kvr_sim_api {
    uv_loop_t *loop;
    kvr_sim_api_cfg cfg;
    char *model;
    kvr_sim_sched *sched;
    kvr_sim_kv *kv;
    kvr_sim_events *events;
    kvr_sim_faults *faults;
    kvr_metrics *reg;
    kvr_sim_vmetrics *vm;
    size_t ndelayed;
    uint64_t next_id;
    kvr_buf scratch;
};

/* One completion request, from arrival to the end of its response. It is freed once the HTTP
 * request is released, the engine no longer knows it and its delay timer is closed. */
typedef struct sim_req {
    kvr_sim_api *api;
    kvr_http_req *http;
    kvr_sim_seq *seq;
    uv_timer_t timer;
    int timer_open, delayed;
    int chat, stream, include_usage, fail, stalled, in_cb;
    uint32_t *tokens; /* until submitted */
    size_t ntok, max_tokens;
    kvr_buf text; /* non-streaming output */
    char id[48];
    char *xrid; /* the client's x-request-id, echoed */
    int64_t created;
    long events;
    uint64_t arrival_ns, last_token_ns, gen_seed;
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

static void send_error_ex(kvr_http_req *req, int status, const char *msg, const char *param,
                          const char *code, const kvr_http_header *extra, size_t nextra)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_oai_error_json(&b, status, msg, param, code) < 0)
        kvr_buf_reset(&b);
    kvr_http_resp_simple(req, status, JSON_TYPE, extra, nextra, b.data ? b.data : "", b.len);
    kvr_buf_free(&b);
}

static void send_error(kvr_http_req *req, int status, const char *msg, const char *param)
{
    send_error_ex(req, status, msg, param, NULL, NULL, 0);
}

/* ---- request lifetime ---- */

static void maybe_free(sim_req *r)
{
    if (r->http || r->seq || r->timer_open || r->in_cb)
        return;
    free(r->tokens);
    free(r->xrid);
    kvr_buf_free(&r->text);
    free(r);
}

static void abort_seq(sim_req *r)
{
    if (r->seq) {
        kvr_sim_sched_abort(r->api->sched, r->seq);
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

/* Writes one SSE event: `b` holds `data: <json>` (the blank line is added here). The
 * stall/drop faults are applied first: they count events already written. */
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

/* `data: {"id":…,"object":…,"created":…,"model":…,"choices":[` */
static int chunk_head(sim_req *r, kvr_buf *b)
{
    kvr_sim_api *api = r->api;
    kvr_buf_reset(b);
    int rc = kvr_buf_puts(b, "data: {\"id\":\"");
    rc |= kvr_buf_puts(b, r->id);
    rc |= kvr_buf_puts(b, r->chat ? "\",\"object\":\"chat.completion.chunk\",\"created\":"
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

/* ---- engine callbacks ---- */

static void on_token(void *ud, kvr_sim_seq *seq, uint32_t id, size_t idx, int last)
{
    (void)id;
    sim_req *r = ud;
    kvr_sim_api *api = r->api;
    uint64_t now = kvr_now_ns();
    if (idx == 0) {
        const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
        uint64_t adm = in->admitted_ns ? in->admitted_ns : now;
        kvr_sim_vmetrics_first_token(api->vm, (double)(now - r->arrival_ns) / 1e9,
                                     (double)(adm - in->arrival_ns) / 1e9, in->prompt_tokens);
    } else {
        kvr_sim_vmetrics_token(api->vm, (double)(now - r->last_token_ns) / 1e9);
    }
    r->last_token_ns = now;
    if (!r->http)
        return;
    const char *piece;
    size_t n;
    kvr_sim_gen_token(r->gen_seed, idx, &piece, &n);
    if (!r->stream) {
        kvr_buf_append(&r->text, piece, n);
        return;
    }
    r->in_cb = 1;
    kvr_buf *b = &api->scratch;
    if (idx == 0 && r->chat) {
        chunk_head(r, b);
        kvr_buf_puts(b, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                        "\"logprobs\":null,\"finish_reason\":null}]}");
        sse_send(r, b);
    }
    chunk_head(r, b);
    kvr_buf_puts(b, r->chat ? "{\"index\":0,\"delta\":{\"content\":" : "{\"index\":0,\"text\":");
    put_json_str(b, piece, n);
    kvr_buf_puts(b, r->chat ? "}," : ",");
    kvr_buf_puts(b, last ? "\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}"
                         : "\"logprobs\":null,\"finish_reason\":null}]}");
    sse_send(r, b);
    r->in_cb = 0;
    maybe_free(r); /* a drop fault released everything */
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
    if (r->http && !r->stalled) {
        kvr_http_resp_end(r->http);
        r->http = NULL;
    }
}

static void finish_json(sim_req *r, const kvr_sim_seq_info *in)
{
    kvr_sim_api *api = r->api;
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"id\":\"");
    kvr_buf_puts(b, r->id);
    kvr_buf_puts(b, r->chat ? "\",\"object\":\"chat.completion\",\"created\":"
                            : "\",\"object\":\"text_completion\",\"created\":");
    put_u64(b, (uint64_t)r->created);
    kvr_buf_puts(b, ",\"model\":");
    put_json_str(b, api->model, strlen(api->model));
    if (r->chat) {
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
    put_usage(b, in->prompt_tokens, in->output_tokens, in->cached_tokens);
    if (kvr_buf_puts(b, "}") < 0) {
        send_error(r->http, 500, "response too large", NULL);
    } else {
        send_json(r->http, 200, b, r->xrid);
    }
    r->http = NULL;
}

static void on_finish(void *ud, kvr_sim_seq *seq)
{
    sim_req *r = ud;
    const kvr_sim_seq_info *in = kvr_sim_seq_get_info(seq);
    r->seq = NULL; /* freed by the engine when this returns */
    kvr_sim_vmetrics_finished(r->api->vm, (double)(kvr_now_ns() - r->arrival_ns) / 1e9);
    r->in_cb = 1;
    if (r->http && !r->stalled) {
        if (r->stream)
            finish_stream(r, in);
        else
            finish_json(r, in);
    }
    r->in_cb = 0;
    maybe_free(r); /* a stalled response stays until the client leaves */
}

static const kvr_sim_seq_cbs seq_cbs = {on_token, on_finish};

/* ---- admission ---- */

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
        kvr_http_header h[3] = {
            {"Content-Type", 12, "text/event-stream; charset=utf-8", 32},
            {"Cache-Control", 13, "no-cache", 8},
            {"x-request-id", 12, r->xrid ? r->xrid : "", r->xrid ? strlen(r->xrid) : 0},
        };
        kvr_http_resp_start(r->http, 200, h, r->xrid ? 3 : 2, -1);
    } else if (f->drop_after_events == 0) {
        drop(r); /* no response at all */
        maybe_free(r);
        return;
    } else if (f->stall_after_events == 0) {
        r->stalled = 1; /* generate, but never answer */
    }
    uint32_t *t = r->tokens;
    r->tokens = NULL;
    r->seq = kvr_sim_sched_submit(api->sched, t, r->ntok, r->max_tokens, &seq_cbs, r);
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
    char msg[512];
    snprintf(msg, sizeof(msg), "The model `%.300s` does not exist.",
             json_is_string(m) ? json_string_value(m) : "(not a string)");
    send_error_ex(req, 404, msg, "model", "model_not_found", NULL, 0);
    return -1;
}

static void completions(kvr_sim_api *api, kvr_http_req *req, int chat)
{
    json_t *j = parse_body(req);
    if (!j)
        return;
    if (check_model(api, req, j) < 0)
        goto out;
    const json_t *stream = json_object_get(j, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream)) {
        send_error(req, 400, "'stream' must be a boolean", "stream");
        goto out;
    }
    size_t n = 1, max_tokens = api->cfg.default_max_tokens;
    if (get_count(j, "n", &n) < 0 || n != 1) {
        send_error(req, 400, "kvroute-sim supports only n = 1", "n");
        goto out;
    }
    int got = chat ? get_count(j, "max_completion_tokens", &max_tokens) : 0;
    if (got == 0)
        got = get_count(j, "max_tokens", &max_tokens);
    if (got < 0) {
        send_error(req, 400, "max_tokens must be at least 1", "max_tokens");
        goto out;
    }
    kvr_sim_toks toks;
    kvr_sim_toks_init(&toks, api->cfg.max_model_len);
    const char *err = NULL, *param = NULL;
    int rc;
    if (chat) {
        const json_t *agp = json_object_get(j, "add_generation_prompt");
        rc = kvr_sim_render_chat(&toks, json_object_get(j, "messages"), json_object_get(j, "tools"),
                                 agp ? json_is_true(agp) : 1, &err, &param);
    } else {
        rc = kvr_sim_render_completion(&toks, json_object_get(j, "prompt"), &err);
        param = "prompt";
    }
    if (rc < 0 || toks.oom) {
        kvr_sim_toks_free(&toks);
        if (rc < 0)
            send_error(req, 400, err, param);
        else
            send_error(req, 503, "out of memory", NULL);
        goto out;
    }
    size_t p = toks.total;
    if (p + max_tokens > api->cfg.max_model_len) {
        char msg[400];
        snprintf(msg, sizeof(msg),
                 "This model's maximum context length is %u tokens. However, you requested %zu "
                 "tokens (%zu in the messages, %zu in the completion). Please reduce the length "
                 "of the messages or completion.",
                 api->cfg.max_model_len, p + max_tokens, p, max_tokens);
        kvr_sim_toks_free(&toks);
        send_error(req, 400, msg, "messages");
        goto out;
    }
    if (!kvr_sim_sched_fits(api->sched, p + max_tokens)) {
        char msg[300];
        snprintf(msg, sizeof(msg),
                 "the request needs %zu tokens of KV cache but the cache holds only %zu "
                 "(--kv-blocks × --block-size)",
                 p + max_tokens,
                 (size_t)kvr_sim_kv_num_blocks(api->kv) * kvr_sim_kv_block_size(api->kv));
        kvr_sim_toks_free(&toks);
        send_error(req, 400, msg, "max_tokens");
        goto out;
    }
    if (kvr_sim_sched_num_waiting(api->sched) + api->ndelayed >= api->cfg.max_waiting) {
        kvr_sim_toks_free(&toks);
        kvr_http_header ra = {"Retry-After", 11, "1", 1};
        send_error_ex(req, 503, "too many requests waiting (--max-waiting)", NULL, NULL, &ra, 1);
        goto out;
    }
    sim_req *r = calloc(1, sizeof(*r));
    uint32_t *t = kvr_sim_toks_take(&toks);
    uint32_t *t2 = t ? realloc(t, (p + max_tokens) * sizeof(uint32_t)) : NULL;
    const char *xrid = kvr_http_req_header(req, "x-request-id");
    if (!r || !t2) {
        free(r);
        free(t2 ? t2 : t);
        send_error(req, 503, "out of memory", NULL);
        goto out;
    }
    r->api = api;
    r->http = req;
    r->tokens = t2;
    r->ntok = p;
    r->max_tokens = max_tokens;
    r->chat = chat;
    r->stream = json_is_true(stream);
    r->include_usage = json_is_true(json_object_get(json_object_get(j, "stream_options"),
                                                    "include_usage"));
    r->xrid = xrid && *xrid ? strdup(xrid) : NULL;
    /* TTFT and e2e count from the complete request, like vLLM's arrival_time (a slow client
     * body upload is not the engine's latency) */
    r->arrival_ns = kvr_now_ns();
    r->created = kvr_unix_time();
    kvr_buf_init(&r->text, 0);
    /* ids: unique per process, reproducible with --seed (splitmix64 of a counter) */
    uint64_t z = api->cfg.seed + ++api->next_id * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    snprintf(r->id, sizeof(r->id), "%s%016llx%08llx", chat ? "chatcmpl-" : "cmpl-",
             (unsigned long long)z, (unsigned long long)api->next_id);
    r->fail = kvr_sim_faults_should_fail(api->faults);
    kvr_http_req_cbs cbs = {NULL, on_client_gone};
    kvr_http_req_set_cbs(req, &cbs, r);
    json_decref(j);
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
    return;
out:
    json_decref(j);
}

/* ---- other endpoints ---- */

static void tokenize(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = parse_body(req);
    if (!j)
        return;
    if (check_model(api, req, j) < 0) {
        json_decref(j);
        return;
    }
    kvr_sim_toks toks;
    kvr_sim_toks_init(&toks, api->cfg.max_model_len);
    const char *err = NULL, *param = NULL;
    int rc;
    const json_t *messages = json_object_get(j, "messages");
    const json_t *prompt = json_object_get(j, "prompt");
    if (messages) {
        const json_t *agp = json_object_get(j, "add_generation_prompt");
        rc = kvr_sim_render_chat(&toks, messages, json_object_get(j, "tools"),
                                 agp ? json_is_true(agp) : 1, &err, &param);
    } else if (json_is_string(prompt)) {
        const json_t *ast = json_object_get(j, "add_special_tokens");
        if (!ast || json_is_true(ast))
            kvr_sim_toks_push(&toks, KVR_SIM_TOK_BOS);
        kvr_sim_tokenize(&toks, json_string_value(prompt), json_string_length(prompt));
        rc = 0;
    } else if (prompt) {
        rc = kvr_sim_render_completion(&toks, prompt, &err);
        param = "prompt";
    } else {
        rc = -1;
        err = "either 'prompt' or 'messages' is required";
    }
    json_decref(j);
    if (rc < 0 || toks.oom || toks.total > toks.len) {
        char msg[200];
        int status = rc < 0 ? 400 : toks.oom ? 503 : 400;
        if (rc == 0 && toks.oom)
            snprintf(msg, sizeof(msg), "out of memory");
        else if (rc == 0)
            snprintf(msg, sizeof(msg), "the prompt has %zu tokens, more than max_model_len %u",
                     toks.total, api->cfg.max_model_len);
        kvr_sim_toks_free(&toks);
        send_error(req, status, rc < 0 ? err : msg, param);
        return;
    }
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"count\":");
    put_u64(b, toks.len);
    kvr_buf_puts(b, ",\"max_model_len\":");
    put_u64(b, api->cfg.max_model_len);
    kvr_buf_puts(b, ",\"tokens\":[");
    for (size_t i = 0; i < toks.len; i++) {
        if (i)
            kvr_buf_append(b, ",", 1);
        put_u64(b, toks.ids[i]);
    }
    int ok = kvr_buf_puts(b, "],\"token_strs\":null}") == 0;
    kvr_sim_toks_free(&toks);
    if (ok)
        send_json(req, 200, b, NULL);
    else
        send_error(req, 503, "out of memory", NULL);
}

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

static void reset_cache(kvr_sim_api *api, kvr_http_req *req)
{
    if (kvr_sim_kv_reset(api->kv) < 0) {
        send_error(req, 409,
                   "cannot reset the prefix cache while requests hold blocks (vLLM refuses too)",
                   NULL);
        return;
    }
    if (api->events)
        kvr_sim_events_flush(api->events); /* AllBlocksCleared goes out at once */
    kvr_buf *b = &api->scratch;
    kvr_buf_reset(b);
    kvr_buf_puts(b, "{\"status\":\"ok\"}");
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

static void stats(kvr_sim_api *api, kvr_http_req *req)
{
    json_t *j = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "model", api->model,
        "running", (json_int_t)kvr_sim_sched_num_running(api->sched), "waiting",
        (json_int_t)kvr_sim_sched_num_waiting(api->sched), "delayed", (json_int_t)api->ndelayed,
        "block_size", (json_int_t)kvr_sim_kv_block_size(api->kv), "kv_blocks",
        (json_int_t)kvr_sim_kv_num_blocks(api->kv), "kv_blocks_used",
        (json_int_t)kvr_sim_kv_num_used(api->kv), "kv_blocks_cached",
        (json_int_t)kvr_sim_kv_num_cached(api->kv), "evictions",
        (json_int_t)kvr_sim_kv_evictions(api->kv), "prefix_cache_queries",
        (json_int_t)kvr_sim_sched_cache_queries(api->sched), "prefix_cache_hits",
        (json_int_t)kvr_sim_sched_cache_hits(api->sched), "preemptions",
        (json_int_t)kvr_sim_sched_preemptions(api->sched), "steps",
        (json_int_t)kvr_sim_sched_steps(api->sched), "kv_events_next_seq",
        (json_int_t)(api->events ? kvr_sim_events_next_seq(api->events) : 0),
        "kv_events_dropped", (json_int_t)(api->events ? kvr_sim_events_dropped(api->events) : 0),
        "model_us", kvr_sim_sched_model_us(api->sched));
    reply_json(req, 200, j);
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

void kvr_sim_api_handle(kvr_http_req *req, void *ud)
{
    kvr_sim_api *api = ud;
    const char *path = kvr_http_req_path(req);
    int post;
    if (strcmp(path, "/v1/chat/completions") == 0) {
        if (method_ok(req, POST_ONLY, &post))
            completions(api, req, 1);
    } else if (strcmp(path, "/v1/completions") == 0) {
        if (method_ok(req, POST_ONLY, &post))
            completions(api, req, 0);
    } else if (strcmp(path, "/tokenize") == 0) {
        if (method_ok(req, POST_ONLY, &post))
            tokenize(api, req);
    } else if (strcmp(path, "/v1/models") == 0) {
        if (method_ok(req, GET_ONLY, &post))
            models(api, req);
    } else if (strcmp(path, "/health") == 0) {
        if (method_ok(req, GET_ONLY, &post))
            health(api, req);
    } else if (strcmp(path, "/metrics") == 0) {
        if (method_ok(req, GET_ONLY, &post))
            metrics(api, req);
    } else if (strcmp(path, "/sim/reset_prefix_cache") == 0 ||
               strcmp(path, "/reset_prefix_cache") == 0) {
        if (method_ok(req, POST_ONLY, &post))
            reset_cache(api, req);
    } else if (strcmp(path, "/sim/faults") == 0) {
        if (method_ok(req, GET_POST, &post))
            faults(api, req, post);
    } else if (strcmp(path, "/sim/stats") == 0) {
        if (method_ok(req, GET_ONLY, &post))
            stats(api, req);
    } else {
        send_error(req, 404, "not found", NULL);
    }
}

kvr_sim_api *kvr_sim_api_new(uv_loop_t *loop, const kvr_sim_api_cfg *cfg, kvr_sim_sched *sched,
                             kvr_sim_kv *kv, kvr_sim_events *events, kvr_sim_faults *faults,
                             kvr_metrics *reg, kvr_sim_vmetrics *vm)
{
    kvr_sim_api *api = calloc(1, sizeof(*api));
    if (!api)
        return NULL;
    api->model = strdup(cfg->model);
    if (!api->model) {
        free(api);
        return NULL;
    }
    api->loop = loop;
    api->cfg = *cfg;
    api->cfg.model = api->model;
    api->sched = sched;
    api->kv = kv;
    api->events = events;
    api->faults = faults;
    api->reg = reg;
    api->vm = vm;
    kvr_buf_init(&api->scratch, 64u << 20);
    return api;
}

void kvr_sim_api_free(kvr_sim_api *api)
{
    if (!api)
        return;
    kvr_buf_free(&api->scratch);
    free(api->model);
    free(api);
}
