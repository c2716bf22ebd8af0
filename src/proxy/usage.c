/* Token usage scanning of JSON and SSE responses. */
#include "proxy/usage.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "routing/keys.h"
#include "util/json_read.h"
#include "util/json_scan.h"

/* Chat and completions write usage.prompt_tokens(_details); the Responses API writes
 * usage.input_tokens(_details), inside `response` for its streamed response.completed event. */
static void reply_bytes(kvr_usage *u, const char *p, size_t n)
{
    if (u->reply_over)
        return;
    if (u->reply.len + n > u->reply_cap || kvr_buf_append(&u->reply, p, n) < 0)
        u->reply_over = 1;
}

static void reply_text(kvr_usage *u, const json_t *s)
{
    if (json_is_string(s))
        reply_bytes(u, json_string_value(s), json_string_length(s));
}

/* A tool-call fragment: the first carries the name, the rest extend the arguments. */
static void reply_call(kvr_usage *u, const json_t *tc, size_t pos)
{
    const json_t *fn = json_object_get(tc, "function");
    json_int_t idx = json_integer_value(json_object_get(tc, "index"));
    size_t i = json_is_integer(json_object_get(tc, "index")) ? (size_t)idx : pos;
    if (!u->calls)
        u->calls = json_array();
    if (!u->calls || i > json_array_size(u->calls) || i > 128) {
        u->reply_over = 1;
        return;
    }
    if (i == json_array_size(u->calls))
        json_array_append_new(u->calls, json_pack("{s:{s:s,s:s}}", "function", "name", "",
                                                  "arguments", ""));
    json_t *have = json_object_get(json_array_get(u->calls, i), "function");
    const char *keys[] = {"name", "arguments"};
    for (int k = 0; k < 2; k++) {
        const json_t *part = json_object_get(fn, keys[k]);
        if (!json_is_string(part))
            continue;
        json_t *old = json_object_get(have, keys[k]);
        size_t ol = json_string_length(old), pl = json_string_length(part);
        if (ol + pl > u->reply_cap) {
            u->reply_over = 1;
            return;
        }
        char *joined = malloc(ol + pl + 1);
        if (!joined) {
            u->reply_over = 1;
            return;
        }
        memcpy(joined, json_string_value(old), ol);
        memcpy(joined + ol, json_string_value(part), pl);
        json_object_set_new(have, keys[k], json_stringn_nocheck(joined, ol + pl));
        free(joined);
    }
}

/* The reply parts of one parsed JSON body or SSE event. */
static void take_reply(kvr_usage *u, const json_t *j)
{
    const json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    const json_t *msg = json_object_get(c0, "message"), *delta = json_object_get(c0, "delta");
    const json_t *part = msg ? msg : delta, *tc;
    size_t i;
    if (part) {
        reply_text(u, json_object_get(part, "content"));
        json_array_foreach(json_object_get(part, "tool_calls"), i, tc)
            reply_call(u, tc, i);
    } else if (json_is_string(json_object_get(c0, "text"))) {
        reply_text(u, json_object_get(c0, "text"));
    }
    if (msg || json_is_string(json_object_get(c0, "finish_reason")))
        u->reply_done = 1;
    /* Responses: the whole output of the final response object (JSON body, or the
     * response.completed event), never the deltas. */
    const char *o = json_string_value(json_object_get(j, "object"));
    const json_t *resp = o && !strcmp(o, "response") ? j : NULL;
    const char *t = json_string_value(json_object_get(j, "type"));
    if (t && !strcmp(t, "response.completed"))
        resp = json_object_get(j, "response");
    const json_t *item, *cp;
    size_t k;
    json_array_foreach(json_object_get(resp, "output"), i, item) {
        const char *it = json_string_value(json_object_get(item, "type"));
        json_array_foreach(it && !strcmp(it, "message") ? json_object_get(item, "content") : NULL,
                           k, cp) reply_text(u, json_object_get(cp, "text"));
    }
    if (resp)
        u->reply_done = 1;
}

/* ---- Anthropic Messages ---- */

/* A content block starts: text and tool_use blocks are kept (their first bytes: the text, or
 * a non-empty input sent whole); other kinds hold their index and nothing else. A tool input
 * that is not an object would be taught as {}: such a reply teaches nothing. */
static void msg_block(kvr_usage *u, const json_t *b)
{
    const char *t = json_string_value(json_object_get(b, "type"));
    int text = t && !strcmp(t, "text"), tool = t && !strcmp(t, "tool_use");
    if (!u->calls)
        u->calls = json_array();
    if (json_array_size(u->calls) >= 128) {
        u->reply_over = 1;
        return;
    }
    const json_t *name = json_object_get(b, "name");
    json_t *e = json_pack("{s:s,s:I}", "type", text ? "text" : tool ? "tool_use" : "other", "at",
                          (json_int_t)u->reply.len);
    if (e && tool &&
        json_object_set_new(e, "name", json_is_string(name) ? json_incref((json_t *)name)
                                                             : json_string("")) < 0) {
        json_decref(e);
        e = NULL;
    }
    if (!e || json_array_append_new(u->calls, e) < 0) {
        u->reply_over = 1;
        return;
    }
    const json_t *input = json_object_get(b, "input");
    if (text) {
        reply_text(u, json_object_get(b, "text"));
    } else if (tool && input && !json_is_object(input)) {
        u->reply_over = 1;
    } else if (tool && json_object_size(input)) {
        char *s = json_dumps(input, JSON_COMPACT);
        if (!s)
            u->reply_over = 1;
        else
            reply_bytes(u, s, strlen(s));
        free(s);
    }
}

/* A delta extends the block that started last (Anthropic streams blocks one at a time). */
static void msg_delta(kvr_usage *u, const json_t *j)
{
    size_t n = json_array_size(u->calls);
    const json_t *idx = json_object_get(j, "index"), *d = json_object_get(j, "delta");
    if (!n || !json_is_integer(idx) || json_integer_value(idx) != (json_int_t)(n - 1)) {
        u->reply_over = 1;
        return;
    }
    const char *bt = json_string_value(json_object_get(json_array_get(u->calls, n - 1), "type"));
    const char *dt = json_string_value(json_object_get(d, "type"));
    if (!dt || !strcmp(bt, "other"))
        return;
    if (!strcmp(dt, "text_delta") && !strcmp(bt, "text"))
        reply_text(u, json_object_get(d, "text"));
    else if (!strcmp(dt, "input_json_delta") && !strcmp(bt, "tool_use"))
        reply_text(u, json_object_get(d, "partial_json"));
}

static void msg_reply(kvr_usage *u, const json_t *j, const char *type)
{
    size_t i;
    const json_t *b;
    if (!strcmp(type, "message")) { /* a JSON body */
        json_array_foreach(json_object_get(j, "content"), i, b)
            msg_block(u, b);
        u->reply_done = 1;
    } else if (!strcmp(type, "content_block_start")) {
        const json_t *idx = json_object_get(j, "index");
        size_t next = json_array_size(u->calls);
        if (!json_is_integer(idx) || json_integer_value(idx) != (json_int_t)next)
            u->reply_over = 1;
        else
            msg_block(u, json_object_get(j, "content_block"));
    } else if (!strcmp(type, "content_block_delta")) {
        msg_delta(u, j);
    } else if (!strcmp(type, "message_stop") ||
               (!strcmp(type, "message_delta") &&
                json_is_string(json_object_get(json_object_get(j, "delta"), "stop_reason")))) {
        u->reply_done = 1;
    }
}

static void take_messages(kvr_usage *u, const json_t *j)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return;
    if (u->reply_cap && !u->reply_over)
        msg_reply(u, j, type);
    const json_t *msg = !strcmp(type, "message_start") ? json_object_get(j, "message") : j;
    const json_t *usage = json_object_get(msg, "usage");
    if (!json_is_object(usage))
        return;
    static const char *const keys[] = {"input_tokens", "cache_read_input_tokens",
                                       "cache_creation_input_tokens", "output_tokens"};
    long long *dst[] = {&u->msg_input, &u->msg_cache_read, &u->msg_cache_creation,
                        &u->completion};
    for (size_t k = 0; k < 4; k++) {
        const json_t *v = json_object_get(usage, keys[k]);
        if (json_is_integer(v))
            *dst[k] = json_integer_value(v);
    }
    if (json_is_integer(json_object_get(usage, keys[1])))
        u->has_cached = 1;
    u->found = 1;
    u->prompt = u->msg_input + u->msg_cache_read + u->msg_cache_creation;
    u->cached = u->msg_cache_read;
}

/* The reply's text and tool_use blocks as the next request will send them back. */
static json_t *msg_reply_message(const kvr_usage *u)
{
    json_t *content = json_array();
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", content);
    if (!m)
        return NULL; /* content went with the failed pack */
    size_t n = json_array_size(u->calls), i;
    const json_t *e;
    json_array_foreach(u->calls, i, e) {
        size_t at = (size_t)json_integer_value(json_object_get(e, "at"));
        size_t end = i + 1 < n ? (size_t)json_integer_value(json_object_get(
                                     json_array_get(u->calls, i + 1), "at"))
                               : u->reply.len;
        const char *type = json_string_value(json_object_get(e, "type")), *p = u->reply.data;
        json_t *b = NULL;
        if (!strcmp(type, "text")) {
            json_t *t = json_stringn(p ? p + at : "", end - at); /* NULL: not UTF-8 */
            b = t ? json_pack("{s:s,s:o}", "type", "text", "text", t) : NULL;
        } else if (!strcmp(type, "tool_use")) {
            json_t *in = end > at ? kvr_json_read(p + at, end - at, NULL) : json_object();
            b = in ? json_pack("{s:s,s:O,s:o}", "type", "tool_use", "name",
                               json_object_get(e, "name"), "input", in)
                   : NULL;
        } else {
            continue;
        }
        if (!b || json_array_append_new(content, b) < 0) {
            json_decref(m);
            return NULL;
        }
    }
    return m;
}

void kvr_usage_messages(kvr_usage *u)
{
    u->messages = 1;
}

/* take()'s reading of a `usage` object (span `usage` of `json`) without a tree, with its
 * rules: a count that is not an integer reads 0; the Responses API's names when
 * `prompt_tokens` is absent and `input_tokens` present. */
static int usage_span(kvr_usage *u, const char *json, const kvr_json_span *usage)
{
    static const char *const names[] = {"prompt_tokens", "input_tokens", "completion_tokens",
                                        "output_tokens", "prompt_tokens_details",
                                        "input_tokens_details"};
    kvr_json_span f[6], cached;
    const char *ub = json + usage->off;
    if (kvr_json_scan(ub, usage->len, names, 6, f) != KVR_JSON_OBJECT)
        return -1; /* not for a span a scan accepted */
    int r = f[0].kind == KVR_JSON_ABSENT && f[1].kind != KVR_JSON_ABSENT;
    u->found = 1;
    u->prompt = f[r ? 1 : 0].ival;
    u->completion = f[r ? 3 : 2].ival;
    kvr_json_span_member(ub, &f[r ? 5 : 4], "cached_tokens", &cached);
    u->has_cached = cached.kind == KVR_JSON_INTEGER;
    u->cached = cached.ival;
    return 0;
}

/* take()'s usage reading without a tree, for the answers whose reply and response id are not
 * wanted: the top-level `usage` object, else `response.usage`. */
static void take_usage_scan(kvr_usage *u, const char *json, size_t len)
{
    static const char *const top[] = {"usage", "response"};
    kvr_json_span t[2], resp;
    if (kvr_json_scan(json, len, top, 2, t) != KVR_JSON_OBJECT)
        return;
    const kvr_json_span *usage = &t[0];
    if (usage->kind != KVR_JSON_OBJECT) {
        if (!kvr_json_span_member(json, &t[1], "usage", &resp) || resp.kind != KVR_JSON_OBJECT)
            return;
        usage = &resp;
    }
    usage_span(u, json, usage);
}

/* Only the token counts are wanted from this answer: no tree, no reply, no response id. */
static int usage_only(const kvr_usage *u)
{
    return !kvr_usage_tree_only && !u->messages && !(u->reply_cap && !u->reply_over) &&
           !(u->want_id && !u->response_id);
}

static int ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Bytes a usage object is made of when it holds no string values and no arrays (vLLM's,
 * SGLang's, OpenAI's): keys, numbers, null, nested detail objects. */
static int usage_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_' || c == '"' || c == ':' || c == ',' || c == '.' || c == '-' || c == '+' ||
           c == '{' || c == '}' || ws((char)c);
}

/* Longest usage object read from the end, bytes: vLLM's with every detail is ~200. */
#define USAGE_TAIL_MAX 2048

/* take_usage_scan() for an answer whose last top-level member is a "usage" object, as chat
 * and completions answers of vLLM, SGLang and OpenAI end: that object is found walking back
 * from the end, without scanning the reply and choices before it (on a 285-byte answer, ~3.7 K
 * instructions of the ~37 K kvroute spends per round_robin request). Also the counts of an
 * answer the whole reading could not take (kvr_usage_finish()). The usage object itself
 * is still scanned (and must be JSON); the bytes before its key are not: an answer that is no
 * JSON text but ends in `"usage":{…}}` is counted, where the scan from the start counts
 * nothing (the client receives it either way). Returns 1 when read, 0 when the answer does
 * not end so (nothing changed: the caller reads it from the start). */
static int usage_tail(kvr_usage *u, const char *json, size_t len)
{
    size_t i = len, b = 0;
    while (b < len && ws(json[b]))
        b++;
    while (i > b && ws(json[i - 1]))
        i--;
    if (b >= len || json[b] != '{' || i < b + 2 || json[i - 1] != '}')
        return 0;
    i--; /* the top level's closing brace */
    while (i > b && ws(json[i - 1]))
        i--;
    if (i <= b || json[i - 1] != '}')
        return 0;
    size_t end = i, depth = 0, lim = end - b > USAGE_TAIL_MAX ? end - USAGE_TAIL_MAX : b;
    for (;;) {
        if (i <= lim)
            return 0;
        unsigned char c = (unsigned char)json[--i];
        if (!usage_byte(c))
            return 0;
        if (c == '}')
            depth++;
        else if (c == '{' && --depth == 0)
            break;
    }
    size_t start = i;
    while (i > b && ws(json[i - 1]))
        i--;
    if (i <= b || json[i - 1] != ':')
        return 0;
    i--;
    while (i > b && ws(json[i - 1]))
        i--;
    if (i < b + 8 || memcmp(json + i - 7, "\"usage\"", 7) != 0)
        return 0;
    i -= 7;
    while (i > b && ws(json[i - 1]))
        i--;
    if (i <= b || (json[i - 1] != ',' && i - 1 != b))
        return 0; /* a key follows the object's brace or a comma */
    kvr_json_span usage = {.off = start, .len = end - start, .kind = KVR_JSON_OBJECT};
    return usage_span(u, json, &usage) == 0;
}

static void take(kvr_usage *u, const char *json, size_t len)
{
    if (usage_only(u)) {
        take_usage_scan(u, json, len);
        return;
    }
    json_t *j = kvr_json_read(json, len, NULL);
    if (u->messages) {
        take_messages(u, j);
        json_decref(j);
        return;
    }
    if (j && u->reply_cap && !u->reply_over)
        take_reply(u, j);
    json_t *usage = j ? json_object_get(j, "usage") : NULL;
    if (!json_is_object(usage))
        usage = json_object_get(json_object_get(j, "response"), "usage");
    if (json_is_object(usage)) {
        int resp = !json_object_get(usage, "prompt_tokens") &&
                   json_object_get(usage, "input_tokens");
        u->found = 1;
        u->prompt = json_integer_value(json_object_get(usage, resp ? "input_tokens"
                                                                   : "prompt_tokens"));
        u->completion = json_integer_value(json_object_get(usage, resp ? "output_tokens"
                                                                       : "completion_tokens"));
        json_t *d = json_object_get(usage, resp ? "input_tokens_details" : "prompt_tokens_details");
        json_t *c = json_object_get(d, "cached_tokens");
        u->has_cached = json_is_integer(c);
        u->cached = json_integer_value(c);
    }
    size_t idlen;
    const char *id = u->want_id && !u->response_id ? kvr_route_response_id(j, &idlen) : NULL;
    if (id)
        u->response_id = strndup(id, idlen);
    json_decref(j);
}

void kvr_usage_want_reply(kvr_usage *u, size_t cap)
{
    u->reply_cap = cap;
    kvr_buf_init(&u->reply, cap);
}

json_t *kvr_usage_reply(const kvr_usage *u, int completions)
{
    if (!u->reply_cap || u->reply_over || !u->reply_done)
        return NULL;
    if (u->messages)
        return msg_reply_message(u);
    json_t *text = json_stringn(u->reply.data ? u->reply.data : "", u->reply.len);
    if (!text) /* not UTF-8 (cut mid-character): the next turn cannot send it either */
        return NULL;
    if (completions)
        return text;
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", text);
    if (m && u->calls && json_array_size(u->calls))
        json_object_set(m, "tool_calls", u->calls);
    return m;
}

int kvr_usage_reply_text(const kvr_usage *u, const char **s, size_t *n)
{
    if (!u->reply_cap || u->reply_over || !u->reply_done || u->messages ||
        (u->calls && json_array_size(u->calls)))
        return 0;
    *s = u->reply.data ? u->reply.data : "";
    *n = u->reply.len;
    return 1;
}

void kvr_usage_init(kvr_usage *u, int sse, size_t cap, int want_id)
{
    memset(u, 0, sizeof(*u));
    u->want_id = want_id;
    kvr_buf_init(&u->buf, cap);
    u->sse = sse;
    u->overflow = cap == 0;
}

int kvr_usage_tree_only;

/* reply_text() of the string `s` of `json`, decoded straight into the reply (no tree, no
 * copy in between). */
static void reply_span(kvr_usage *u, const char *json, const kvr_json_span *s)
{
    if (!s->escaped) {
        reply_bytes(u, json + s->off + 1, s->len - 2);
        return;
    }
    if (u->reply_over)
        return;
    /* Decoding never lengthens a string: its raw bytes bound the room it needs. */
    size_t room = u->reply_cap - u->reply.len, want = s->len - 2 < room ? s->len - 2 : room;
    if (kvr_buf_reserve(&u->reply, want) < 0) {
        u->reply_over = 1;
        return;
    }
    size_t n = kvr_json_span_string(json, s, want ? u->reply.data + u->reply.len : NULL, want);
    if (n > want) {
        u->reply_over = 1; /* over the cap, as reply_bytes() would find */
        return;
    }
    if (n) {
        u->reply.len += n;
        u->reply.data[u->reply.len] = '\0';
    }
}

/* A chat or completions answer read in place, with no tree and no allocation: a JSON body
 * ({"choices":[{"message":{"content":"…"},"finish_reason":…}],"usage":{…}}) or an SSE event
 * (the token chunks {"choices":[{"delta":{"content":"…"},…}]}, a completion's
 * {"choices":[{"text":"…"}]}, the final chunk's usage), with no tool calls, no Responses API
 * fields and no event type. Returns 1 when the answer was read with exactly the effect
 * take() gives it, 0 when take() must read it (nothing changed then). */
static int take_in_place(kvr_usage *u, const char *json, size_t len)
{
    static const char *const top[] = {"choices", "usage", "response", "object", "type"};
    static const char *const choice[] = {"message", "delta", "text", "finish_reason"};
    static const char *const part_names[] = {"content", "tool_calls"};
    kvr_json_span v[5], c0, w[4], d[2];
    if (kvr_usage_tree_only || u->messages)
        return 0;
    int rc = kvr_json_scan(json, len, top, 5, v);
    if (rc < 0)
        return 1; /* not JSON: take() reads nothing from it either */
    if (rc != KVR_JSON_OBJECT || v[2].kind != KVR_JSON_ABSENT || v[4].kind != KVR_JSON_ABSENT ||
        (v[3].kind == KVR_JSON_STRING &&
         (v[3].escaped || (v[3].len == 10 && !memcmp(json + v[3].off, "\"response\"", 10)))))
        return 0; /* a response object or id, an event type: take() */
    const kvr_json_span *text = NULL;
    size_t base = 0;
    int done = 0;
    if (u->reply_cap && !u->reply_over && kvr_json_span_first(json, &v[0], &c0) &&
        c0.kind == KVR_JSON_OBJECT) {
        kvr_json_scan(json + c0.off, c0.len, choice, 4, w);
        /* take_reply(): a message, else a delta, is the part read; a choice with neither
         * gives its text. */
        const kvr_json_span *part = w[0].kind != KVR_JSON_ABSENT ? &w[0] : &w[1];
        if (w[0].kind != KVR_JSON_ABSENT && w[0].kind != KVR_JSON_OBJECT)
            return 0; /* a message that is no object (null, a string): take() */
        if (part->kind == KVR_JSON_OBJECT) {
            base = c0.off + part->off;
            kvr_json_scan(json + base, part->len, part_names, 2, d);
            if (d[1].kind == KVR_JSON_ARRAY && d[1].count)
                return 0; /* tool calls, or their fragments */
            text = &d[0];
        } else if (part->kind == KVR_JSON_ABSENT) {
            base = c0.off;
            text = &w[2];
        }
        done = w[0].kind != KVR_JSON_ABSENT || w[3].kind == KVR_JSON_STRING;
    }
    if (text && text->kind == KVR_JSON_STRING)
        reply_span(u, json + base, text);
    if (done)
        u->reply_done = 1;
    if (v[1].kind == KVR_JSON_OBJECT)
        usage_span(u, json, &v[1]);
    return 1;
}

/* True when the line holds `"<name>"` followed by a colon and an object, whatever the spacing
 * (vLLM writes compact JSON, Python's json.dumps does not). A cheap filter: only such lines
 * are parsed, not every token chunk. */
static int has_object_field(const char *line, size_t len, const char *quoted)
{
    size_t ql = strlen(quoted);
    const char *end = line + len, *p = line;
    while ((p = memmem(p, (size_t)(end - p), quoted, ql))) {
        const char *q = p + ql;
        while (q < end && (*q == ' ' || *q == ':'))
            q++;
        if (q < end && *q == '{')
            return 1;
        p += ql;
    }
    return 0;
}

static void sse_line(kvr_usage *u, const char *line, size_t len)
{
    if (len <= 5 || memcmp(line, "data:", 5) != 0)
        return;
    if ((u->reply_cap && !u->reply_over) || has_object_field(line, len, "\"usage\"") ||
        (u->want_id && !u->response_id && has_object_field(line, len, "\"response\"")))
        if (!take_in_place(u, line + 5, len - 5))
            take(u, line + 5, len - 5);
}

void kvr_usage_feed(kvr_usage *u, const char *data, size_t len)
{
    if (u->overflow)
        return;
    if (!u->sse) {
        if (kvr_buf_append(&u->buf, data, len) < 0)
            u->overflow = 1;
        return;
    }
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (nl && !u->skip_line && !u->buf.len && (!u->buf.cap || n <= u->buf.cap)) {
            sse_line(u, data, n); /* a whole line in this read: read where it lies */
        } else if (u->skip_line || kvr_buf_append(&u->buf, data, n) < 0) {
            /* A line longer than the cap cannot be parsed; skip to its end, which may come in
             * a later read: until then the bytes are still that line's, not a new line (its
             * tail could start with "data:"). */
            kvr_buf_reset(&u->buf);
            u->skip_line = !nl;
            if (!nl)
                return;
        } else if (nl) {
            sse_line(u, u->buf.data ? u->buf.data : "", u->buf.len);
            kvr_buf_reset(&u->buf);
        }
        if (!nl)
            return;
        data += n + 1;
        len -= n + 1;
    }
}

void kvr_usage_finish(kvr_usage *u)
{
    if (u->sse || u->overflow || !u->buf.len)
        return;
    int tried = usage_only(u);
    if (tried && usage_tail(u, u->buf.data, u->buf.len))
        return;
    if (!take_in_place(u, u->buf.data, u->buf.len))
        take(u, u->buf.data, u->buf.len);
    /* The counts must not depend on what else is read (the route's policy): an answer the
     * whole reading could not take (no JSON text, nested deeper than KVR_JSON_MAX_DEPTH) still
     * gives the usage object it ends with, as when only the counts are read (tried above). */
    if (!u->found && !tried && !u->messages && !kvr_usage_tree_only)
        usage_tail(u, u->buf.data, u->buf.len);
}

void kvr_usage_free(kvr_usage *u)
{
    kvr_buf_free(&u->buf);
    kvr_buf_free(&u->reply);
    json_decref(u->calls);
    u->calls = NULL;
    free(u->response_id);
    u->response_id = NULL;
}
