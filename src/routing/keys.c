/* Routing keys: session key and routing text. See keys.h for the serialization. */
#include "routing/keys.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/xxh.h"

#include "routing/anthropic.h"
#include "routing/text_writer.h"
#include "util/json_scan.h"

#define RS KVR_TEXT_RS
#define US KVR_TEXT_US
#define GS KVR_TEXT_GS
#define CANON KVR_TEXT_CANON

/* ---- session sources ------------------------------------------------------------------ */

static const char *const per_request_ids[] = {"x-request-id", "x-trace-id", "x-correlation-id"};

static void set_err(char *err, size_t errlen, const char *msg, const char *item, size_t ilen)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: '%.*s'", msg, (int)(ilen > 80 ? 80 : ilen), item);
}

int kvr_session_sources_parse(kvr_session_sources *out, const char *spec, char *err,
                              size_t errlen)
{
    kvr_session_sources s = {0};
    const char *p = spec ? spec : "";
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *q = p;
        size_t qn = n;
        while (qn && isspace((unsigned char)*q))
            q++, qn--;
        while (qn && isspace((unsigned char)q[qn - 1]))
            qn--;
        p = e ? e + 1 : p + n;
        if (!qn)
            continue;
        int header;
        size_t skip;
        if (qn > 7 && strncmp(q, "header:", 7) == 0)
            header = 1, skip = 7;
        else if (qn > 5 && strncmp(q, "body:", 5) == 0)
            header = 0, skip = 5;
        else {
            set_err(err, errlen, "session source must be header:NAME or body:PATH", q, qn);
            return -1;
        }
        const char *name = q + skip;
        size_t nn = qn - skip;
        if (nn > KVR_SESSION_SOURCE_NAME_MAX) {
            set_err(err, errlen, "session source name too long", q, qn);
            return -1;
        }
        if (s.n == KVR_SESSION_SOURCES_MAX) {
            set_err(err, errlen, "too many session sources", q, qn);
            return -1;
        }
        kvr_session_source *src = &s.src[s.n];
        src->header = header;
        for (size_t i = 0; i < nn; i++)
            src->name[i] = header ? (char)tolower((unsigned char)name[i]) : name[i];
        src->name[nn] = 0;
        if (header) {
            for (size_t i = 0; i < sizeof(per_request_ids) / sizeof(*per_request_ids); i++)
                if (strcmp(src->name, per_request_ids[i]) == 0) {
                    set_err(err, errlen, "per-request ids cannot be session keys", q, qn);
                    return -1;
                }
        } else if (name[0] == '.' || name[nn - 1] == '.' || strstr(src->name, "..")) {
            set_err(err, errlen, "bad body path", q, qn);
            return -1;
        }
        s.n++;
    }
    *out = s;
    return 0;
}

void kvr_session_sources_default(kvr_session_sources *out)
{
    kvr_session_sources_parse(out, KVR_SESSION_SOURCES_DEFAULT, NULL, 0);
}

/* ---- helpers -------------------------------------------------------------------------- */

/* Body value at a dotted path, or NULL. */
static const json_t *body_path(const json_t *body, const char *path)
{
    const json_t *v = body;
    while (v && *path) {
        if (!json_is_object(v))
            return NULL;
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        v = json_object_getn(v, path, n);
        path += n + (dot != NULL);
    }
    return v;
}

int kvr_session_key_append(kvr_buf *out, const char *p, size_t n)
{
    if (n > KVR_SESSION_KEY_MAX) {
        char hx[33];
        kvr_text_hex128(XXH3_128bits(p, n), hx);
        return kvr_buf_append(out, hx, 32);
    }
    return kvr_buf_append(out, p, n);
}

int kvr_session_key_build(const json_t *body, kvr_header_get_fn get, void *ctx,
                          const kvr_session_sources *src, kvr_buf *out)
{
    kvr_session_sources def;
    if (!src) {
        kvr_session_sources_default(&def);
        src = &def;
    }
    for (size_t i = 0; i < src->n; i++) {
        const kvr_session_source *s = &src->src[i];
        if (s->header) {
            size_t n = 0;
            const char *v = get ? get(ctx, s->name, &n) : NULL;
            if (!v || !n)
                continue;
            return kvr_session_key_append(out, v, n) < 0 ? -1 : 1;
        }
        const json_t *v = body_path(body, s->name);
        if (!v || json_is_null(v))
            continue;
        if (json_is_string(v)) {
            if (!json_string_length(v))
                continue;
            return kvr_session_key_append(out, json_string_value(v), json_string_length(v)) < 0
                       ? -1
                       : 1;
        }
        char *txt = json_dumps(v, CANON);
        if (!txt)
            return -1;
        int rc = kvr_session_key_append(out, txt, strlen(txt));
        free(txt);
        return rc < 0 ? -1 : 1;
    }
    return 0;
}

/* ---- routing text (writer and framing: text_writer.h) --------------------------------- */

static void put_str(kvr_text_writer *w, const json_t *s)
{
    kvr_text_put(w, json_string_value(s), json_string_length(s));
}

/* A value that should be a string (name, arguments): its bytes, else its canonical JSON. */
static void put_text_or_canon(kvr_text_writer *w, const json_t *v)
{
    if (json_is_string(v))
        put_str(w, v);
    else if (v && !json_is_null(v))
        kvr_text_canon(w, v);
}

static int is_text_part_type(const char *t)
{
    return t && (!strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text"));
}

/* Content: a string, or parts in order; text parts as 'c', the rest as digests. */
static void put_content(kvr_text_writer *w, const json_t *content)
{
    if (!content || json_is_null(content))
        return;
    if (json_is_string(content)) {
        if (json_string_length(content)) {
            kvr_text_field(w, 'c');
            put_str(w, content);
        }
        return;
    }
    if (!json_is_array(content)) {
        kvr_text_digest_field(w, content);
        return;
    }
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        if (json_is_string(part)) {
            if (json_string_length(part)) {
                kvr_text_field(w, 'c');
                put_str(w, part);
            }
            continue;
        }
        const json_t *text = json_object_get(part, "text");
        if (is_text_part_type(json_string_value(json_object_get(part, "type"))) &&
            json_is_string(text)) {
            if (json_string_length(text)) {
                kvr_text_field(w, 'c');
                put_str(w, text);
            }
            continue;
        }
        kvr_text_digest_field(w, part);
    }
}

static void put_role(kvr_text_writer *w, const json_t *role)
{
    kvr_text_putc(w, RS);
    if (json_is_string(role))
        put_str(w, role);
    else if (role)
        kvr_text_canon(w, role);
}

static void put_call(kvr_text_writer *w, const json_t *name, const json_t *args)
{
    kvr_text_field(w, 'f');
    put_text_or_canon(w, name);
    kvr_text_field(w, 'a');
    put_text_or_canon(w, args);
}

static void put_chat_message(kvr_text_writer *w, const json_t *m)
{
    if (!json_is_object(m)) {
        kvr_text_rec_start_s(w, "#item");
        kvr_text_digest_field(w, m);
        kvr_text_rec_end(w);
        return;
    }
    put_role(w, json_object_get(m, "role"));
    const json_t *v;
    if (json_is_string(v = json_object_get(m, "name"))) {
        kvr_text_field(w, 'n');
        put_str(w, v);
    }
    if (json_is_string(v = json_object_get(m, "tool_call_id"))) {
        kvr_text_field(w, 'i');
        put_str(w, v);
    }
    put_content(w, json_object_get(m, "content"));
    const json_t *calls = json_object_get(m, "tool_calls");
    size_t i;
    const json_t *tc;
    json_array_foreach(calls, i, tc) {
        const json_t *fn = json_object_get(tc, "function");
        if (json_is_object(fn))
            put_call(w, json_object_get(fn, "name"), json_object_get(fn, "arguments"));
        else
            kvr_text_digest_field(w, tc);
    }
    const json_t *fc = json_object_get(m, "function_call");
    if (json_is_object(fc))
        put_call(w, json_object_get(fc, "name"), json_object_get(fc, "arguments"));
    kvr_text_rec_end(w);
}

/* ---- tools ---------------------------------------------------------------------------- */

typedef struct tool_ref {
    const json_t *tool;  /* as sent */
    const json_t *fn;    /* the object holding name/description/parameters */
    const char *name;    /* NULL for tools without a function name (built-in tools) */
    size_t name_len;
} tool_ref;

static int tool_cmp(const void *a, const void *b)
{
    const tool_ref *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = n ? memcmp(x->name ? x->name : "", y->name ? y->name : "", n) : 0;
    if (c)
        return c;
    if (x->name_len != y->name_len)
        return x->name_len < y->name_len ? -1 : 1;
    /* Same name (or both unnamed): canonical JSON decides, so the order never depends on the
     * order sent. Rare, so the allocation does not matter. */
    char *sx = json_dumps(x->tool, CANON), *sy = json_dumps(y->tool, CANON);
    c = sx && sy ? strcmp(sx, sy) : 0;
    free(sx);
    free(sy);
    return c;
}

static void add_tools(tool_ref *refs, size_t *n, const json_t *list)
{
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t) {
        tool_ref *r = &refs[(*n)++];
        r->tool = t;
        const json_t *fn = json_object_get(t, "function");
        r->fn = json_is_object(fn) ? fn : t; /* chat nests under "function"; Responses and
                                                legacy `functions` are flat */
        const json_t *name = json_object_get(r->fn, "name");
        r->name = json_is_string(name) ? json_string_value(name) : NULL;
        r->name_len = r->name ? json_string_length(name) : 0;
    }
}

static void put_tools(kvr_text_writer *w, const json_t *body)
{
    const json_t *tools = json_object_get(body, "tools");
    const json_t *fns = json_object_get(body, "functions");
    size_t total = json_array_size(tools) + json_array_size(fns);
    if (!total)
        return;
    tool_ref *refs = calloc(total, sizeof(*refs));
    if (!refs) {
        w->oom = 1;
        return;
    }
    size_t n = 0;
    add_tools(refs, &n, tools);
    add_tools(refs, &n, fns);
    qsort(refs, n, sizeof(*refs), tool_cmp);
    for (size_t i = 0; i < n; i++) {
        const tool_ref *r = &refs[i];
        kvr_text_rec_start_s(w, "#tool");
        if (r->name) {
            kvr_text_field(w, 'n');
            kvr_text_put(w, r->name, r->name_len);
            const json_t *d = json_object_get(r->fn, "description");
            if (json_is_string(d)) {
                kvr_text_field(w, 'd');
                put_str(w, d);
            }
            const json_t *p = json_object_get(r->fn, "parameters");
            if (p) {
                kvr_text_field(w, 'p');
                kvr_text_canon(w, p);
            }
        } else {
            kvr_text_field(w, 'j');
            kvr_text_canon(w, r->tool);
        }
        kvr_text_rec_end(w);
    }
    free(refs);
}

/* ---- endpoints ------------------------------------------------------------------------ */

static const char *const g_paths[KVR_EP_COUNT] = {
    [KVR_EP_CHAT] = "/v1/chat/completions",
    [KVR_EP_COMPLETIONS] = "/v1/completions",
    [KVR_EP_RESPONSES] = "/v1/responses",
    [KVR_EP_MESSAGES] = "/v1/messages",
    [KVR_EP_COUNT_TOKENS] = "/v1/messages/count_tokens",
    [KVR_EP_EMBEDDINGS] = "/v1/embeddings",
    [KVR_EP_RERANK] = "/v1/rerank",
    [KVR_EP_RERANK_BARE] = "/rerank",
    [KVR_EP_SCORE] = "/v1/score",
    [KVR_EP_TOKENIZE] = "/tokenize",
    [KVR_EP_DETOKENIZE] = "/detokenize",
    [KVR_EP_POOLING] = "/pooling",
    [KVR_EP_CLASSIFY] = "/classify",
};

const char *kvr_endpoint_path(kvr_endpoint ep)
{
    return (unsigned)ep < KVR_EP_COUNT ? g_paths[ep] : "";
}

int kvr_endpoint_find(const char *path, kvr_endpoint *ep)
{
    for (int i = 0; i < KVR_EP_COUNT; i++)
        if (strcmp(path, g_paths[i]) == 0) {
            *ep = (kvr_endpoint)i;
            return 0;
        }
    return -1;
}

int kvr_endpoint_generates(kvr_endpoint ep)
{
    return ep == KVR_EP_CHAT || ep == KVR_EP_COMPLETIONS || ep == KVR_EP_RESPONSES ||
           ep == KVR_EP_MESSAGES;
}

int kvr_endpoint_fills_cache(kvr_endpoint ep)
{
    return ep != KVR_EP_TOKENIZE && ep != KVR_EP_DETOKENIZE && ep != KVR_EP_COUNT_TOKENS;
}

int kvr_endpoint_model_optional(kvr_endpoint ep)
{
    return ep == KVR_EP_TOKENIZE || ep == KVR_EP_DETOKENIZE;
}

static void build_chat(kvr_text_writer *w, const json_t *body)
{
    put_tools(w, body);
    size_t i;
    const json_t *m;
    json_array_foreach(json_object_get(body, "messages"), i, m)
        put_chat_message(w, m);
}

static void put_tokens(kvr_text_writer *w, const json_t *arr)
{
    kvr_text_putc(w, US);
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t) {
        if (json_is_integer(t)) {
            char num[24];
            int n = snprintf(num, sizeof(num), "%lld ", (long long)json_integer_value(t));
            kvr_text_put(w, num, (size_t)n);
        } else {
            kvr_text_canon(w, t);
            kvr_text_putc(w, ' ');
        }
    }
}

/* A completions prompt, or any input text of the same forms. */
static void put_prompt(kvr_text_writer *w, const json_t *prompt)
{
    if (!prompt || json_is_null(prompt))
        return;
    if (json_is_string(prompt)) {
        put_str(w, prompt);
        return;
    }
    if (!json_is_array(prompt)) {
        kvr_text_canon(w, prompt);
        return;
    }
    if (!json_array_size(prompt))
        return;
    if (json_is_integer(json_array_get(prompt, 0))) {
        put_tokens(w, prompt);
        return;
    }
    size_t i;
    const json_t *el;
    json_array_foreach(prompt, i, el) {
        if (i)
            kvr_text_putc(w, RS);
        if (json_is_string(el))
            put_str(w, el);
        else if (json_is_array(el))
            put_tokens(w, el);
        else
            kvr_text_canon(w, el);
    }
}

static void build_completions(kvr_text_writer *w, const json_t *body)
{
    put_prompt(w, json_object_get(body, "prompt"));
}

/* The other endpoints: a chat-style `messages` list where the endpoint takes one, else the
 * input text fields (keys.h). */
static void build_inputs(kvr_text_writer *w, const json_t *body, kvr_route_kind kind)
{
    static const char *const fields[KVR_EP_COUNT][2] = {
        [KVR_EP_EMBEDDINGS] = {"input"},       [KVR_EP_RERANK] = {"query", "documents"},
        [KVR_EP_RERANK_BARE] = {"query", "documents"}, [KVR_EP_SCORE] = {"text_1", "text_2"},
        [KVR_EP_TOKENIZE] = {"prompt"},        [KVR_EP_DETOKENIZE] = {"tokens"},
        [KVR_EP_POOLING] = {"input"},          [KVR_EP_CLASSIFY] = {"input"},
    };
    int chat_form = kind == KVR_EP_EMBEDDINGS || kind == KVR_EP_POOLING ||
                    kind == KVR_EP_CLASSIFY || kind == KVR_EP_TOKENIZE;
    if (chat_form && json_is_array(json_object_get(body, "messages"))) {
        build_chat(w, body);
        return;
    }
    int any = 0;
    for (size_t f = 0; f < 2 && fields[kind][f]; f++) {
        const json_t *v = json_object_get(body, fields[kind][f]);
        if (!v || json_is_null(v))
            continue;
        if (any++)
            kvr_text_putc(w, RS);
        put_prompt(w, v);
    }
}

static void put_response_item(kvr_text_writer *w, const json_t *it)
{
    if (json_is_string(it)) {
        kvr_text_rec_start_s(w, "user");
        put_content(w, it);
        kvr_text_rec_end(w);
        return;
    }
    const char *type = json_string_value(json_object_get(it, "type"));
    const json_t *role = json_object_get(it, "role");
    if ((!type || !strcmp(type, "message")) && role) {
        put_role(w, role);
        put_content(w, json_object_get(it, "content"));
        kvr_text_rec_end(w);
    } else if (type && !strcmp(type, "function_call")) {
        kvr_text_rec_start_s(w, "#function_call");
        put_call(w, json_object_get(it, "name"), json_object_get(it, "arguments"));
        kvr_text_rec_end(w);
    } else if (type && !strcmp(type, "function_call_output")) {
        kvr_text_rec_start_s(w, "#function_call_output");
        const json_t *id = json_object_get(it, "call_id");
        if (json_is_string(id)) {
            kvr_text_field(w, 'i');
            put_str(w, id);
        }
        put_content(w, json_object_get(it, "output"));
        kvr_text_rec_end(w);
    } else {
        kvr_text_rec_start_s(w, "#item");
        kvr_text_digest_field(w, it);
        kvr_text_rec_end(w);
    }
}

static void build_responses(kvr_text_writer *w, const json_t *body)
{
    const json_t *ins = json_object_get(body, "instructions");
    if (ins && !json_is_null(ins)) {
        kvr_text_rec_start_s(w, "#instructions");
        put_content(w, ins);
        kvr_text_rec_end(w);
    }
    put_tools(w, body);
    const json_t *input = json_object_get(body, "input");
    if (json_is_array(input)) {
        size_t i;
        const json_t *it;
        json_array_foreach(input, i, it)
            put_response_item(w, it);
    } else if (input && !json_is_null(input)) {
        put_response_item(w, input);
    }
}

/* Messages: the chat text of the request's chat form (keys.h). */
static void build_messages(kvr_text_writer *w, const json_t *body)
{
    json_t *chat = kvr_anthropic_to_chat(body);
    if (!chat) {
        w->oom = 1;
        return;
    }
    build_chat(w, chat);
    json_decref(chat);
}

int kvr_route_text_build(const json_t *body, kvr_route_kind kind, kvr_buf *out)
{
    kvr_text_writer w = {.b = out};
    if (!json_is_object(body))
        return 0;
    switch (kind) {
    case KVR_ROUTE_CHAT:
        build_chat(&w, body);
        break;
    case KVR_ROUTE_COMPLETIONS:
        build_completions(&w, body);
        break;
    case KVR_ROUTE_RESPONSES:
        build_responses(&w, body);
        break;
    case KVR_ROUTE_MESSAGES:
    case KVR_EP_COUNT_TOKENS:
        build_messages(&w, body);
        break;
    default:
        if ((unsigned)kind < KVR_EP_COUNT)
            build_inputs(&w, body, kind);
        break;
    }
    return w.oom ? -1 : w.cut ? 1 : 0;
}

size_t kvr_route_text_preamble(const char *text, size_t len)
{
    static const char tag[] = {RS, 'u', 's', 'e', 'r'};
    /* RS opens each message: memchr skips the text between them at memory speed. */
    for (const char *p = text, *end = text + len; (p = memchr(p, RS, (size_t)(end - p)));) {
        if ((size_t)(end - p) < sizeof(tag) || memcmp(p, tag, sizeof(tag))) {
            p++;
            continue;
        }
        const char *after = p + sizeof(tag);
        p = after;
        if (after < end && *after == GS)
            return (size_t)(after - text); /* an empty user message */
        if (after + 1 < end && *after == US)
            return (size_t)(after + 2 - text); /* past its first field's letter */
    }
    return 0;
}

int kvr_route_text_append_reply(kvr_buf *text, kvr_route_kind kind, const json_t *reply)
{
    kvr_text_writer w = {.b = text};
    if (kind == KVR_ROUTE_COMPLETIONS) {
        /* A framed text (token ids, a batch) starts with a control byte; a string does not. */
        if (!json_is_string(reply) || (text->len && (text->data[0] == RS || text->data[0] == US)))
            return 0;
        put_str(&w, reply);
    } else if (kind == KVR_ROUTE_MESSAGES && json_is_object(reply)) {
        json_t *msgs = json_array();
        if (!msgs || kvr_anthropic_message_to_chat(reply, msgs) < 0)
            w.oom = 1;
        size_t i;
        const json_t *m;
        json_array_foreach(msgs, i, m)
            put_chat_message(&w, m);
        json_decref(msgs);
    } else if (json_is_object(reply)) {
        put_chat_message(&w, reply);
    } else {
        return 0;
    }
    return w.oom ? -1 : 1;
}

int kvr_route_text_append_reply_text(kvr_buf *text, kvr_route_kind kind, const char *s,
                                     size_t n)
{
    if (kind == KVR_ROUTE_MESSAGES || !kvr_json_utf8_valid(s, n))
        return 0;
    kvr_text_writer w = {.b = text};
    if (kind == KVR_ROUTE_COMPLETIONS) {
        if (text->len && (text->data[0] == RS || text->data[0] == US))
            return 0;
        kvr_text_put(&w, s, n);
        return w.oom ? -1 : 1;
    }
    /* put_chat_message() of {"role": "assistant", "content": s} */
    kvr_text_putc(&w, RS);
    kvr_text_put(&w, "assistant", 9);
    if (n) {
        kvr_text_field(&w, 'c');
        kvr_text_put(&w, s, n);
    }
    kvr_text_rec_end(&w);
    return w.oom ? -1 : 1;
}

int kvr_route_keys_build(const json_t *body, kvr_route_kind kind, kvr_header_get_fn get,
                         void *ctx, const kvr_session_sources *src, kvr_buf *text,
                         kvr_buf *session)
{
    int s = kvr_session_key_build(body, get, ctx, src, session);
    int t = kvr_route_text_build(body, kind, text);
    if (s < 0 || t < 0)
        return -1;
    return t;
}

const char *kvr_route_previous_response_id(const json_t *body, size_t *len)
{
    const json_t *v = json_object_get(body, "previous_response_id");
    if (!json_is_string(v) || !json_string_length(v))
        return NULL;
    *len = json_string_length(v);
    return json_string_value(v);
}

const char *kvr_route_response_id(const json_t *answer, size_t *len)
{
    const json_t *obj = NULL;
    const char *o = json_string_value(json_object_get(answer, "object"));
    if (o && !strcmp(o, "response"))
        obj = answer;
    else if (json_is_object(json_object_get(answer, "response")))
        obj = json_object_get(answer, "response");
    const json_t *id = json_object_get(obj, "id");
    if (!json_is_string(id) || !json_string_length(id))
        return NULL;
    *len = json_string_length(id);
    return json_string_value(id);
}
