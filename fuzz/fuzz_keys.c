/* libFuzzer harness for what kvroute derives from a client's JSON body before routing:
 * kvr_json_read (src/util/json_read.c), the routing keys of every endpoint
 * (src/routing/keys.c), body validation (src/api/validate.c) and the `model` span used to
 * rewrite the body for an upstream model (kvr_json_member_span).
 *
 * Differential: json_read.h promises to accept exactly what json_loadb(buf, len, 0, …)
 * accepts and to build a json_equal() value. Its stated exceptions are the wording of error
 * messages and a jansson bug: jansson skips one NUL byte right after a number or literal. So
 * when only jansson accepts, the input must contain such NULs and nothing else may differ:
 * with its NUL bytes removed, the reader must accept it and build jansson's value. Any other
 * disagreement on acceptance or value aborts.
 *
 * Other checks are the documented contracts: a session key is at most KVR_SESSION_KEY_MAX
 * bytes and a present header source wins as sent (or as its digest); the routing text cut at
 * a cap is a byte prefix of the full text and says it was cut; validation answers 0 or 400
 * with a message; the `model` span of an accepted object lies inside the buffer, holds one
 * JSON value, and replacing it keeps the body valid JSON (what proxy.c's attempt_body does).
 *
 * The scanner (util/json_scan.h, routing/fields.h: what the proxy reads without a tree) is
 * checked against the tree: it accepts exactly what kvr_json_read accepts; every located
 * member has the tree's kind and value (its span re-read with jansson equals the tree's
 * value, a string decodes to the tree's bytes, an integer has its value, an array's summary
 * counts what the tree holds); validation on the scan gives the same status, message and
 * param for every endpoint; session key, previous_response_id and the token counts match.
 * The scan with its 32-byte string path off must give exactly what it gives with it on. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "api/validate.h"
#include "routing/fields.h"
#include "routing/keys.h"
#include "util/json_read.h"
#include "util/json_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Header sets the getter serves: none of the session headers (the body decides), a short
 * x-conversation-id, and an x-session-id longer than KVR_SESSION_KEY_MAX (digested). */
typedef struct hdrs {
    const char *const *kv; /* name, value, ..., NULL */
} hdrs;

static char g_long_id[KVR_SESSION_KEY_MAX + 45];

static const char *const g_plain[] = {"content-type", "application/json", "authorization",
                                      "Bearer sk-fuzz", NULL};
static const char *const g_conv[] = {"content-type", "application/json", "x-conversation-id",
                                     "conv-7", NULL};
static const char *const g_long[] = {"x-session-id", g_long_id, NULL};

static const char *get_hdr(void *ctx, const char *name, size_t *len)
{
    const hdrs *h = ctx;
    for (const char *const *p = h->kv; *p; p += 2)
        if (strcasecmp(p[0], name) == 0) {
            *len = strlen(p[1]);
            return p[1];
        }
    return NULL;
}

static int is_hex32(const char *p, size_t n)
{
    if (n != 32)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    return 1;
}

static void check_keys(const json_t *body, const kvr_session_sources *src)
{
    const hdrs sets[] = {{g_plain}, {g_conv}, {g_long}};
    for (int kind = 0; kind < KVR_EP_COUNT; kind++) {
        kvr_buf first; /* the text must not depend on the headers */
        kvr_buf_init(&first, 0);
        for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
            kvr_buf text, session;
            kvr_buf_init(&text, 32u << 20); /* kvroute's default --max-routing-text-bytes */
            kvr_buf_init(&session, 0);
            int rc = kvr_route_keys_build(body, (kvr_route_kind)kind, get_hdr, (void *)&sets[s],
                                          src, &text, &session);
            if (rc != 0)
                __builtin_trap(); /* 1 = cut (not at 32 MiB here), -1 = out of memory */
            if (session.len > KVR_SESSION_KEY_MAX)
                __builtin_trap();
            if (s == 1 && (session.len != 6 || memcmp(session.data, "conv-7", 6) != 0))
                __builtin_trap();
            if (s == 2 && !is_hex32(session.data, session.len))
                __builtin_trap();
            if (s == 0) {
                if (kvr_buf_append(&first, text.data, text.len) < 0)
                    abort();
            } else if (text.len != first.len ||
                       (text.len && memcmp(text.data, first.data, text.len) != 0)) {
                __builtin_trap();
            }
            kvr_buf_free(&text);
            kvr_buf_free(&session);
        }
        /* Cut at half: a byte prefix of the full text, reported as cut. */
        if (first.len) {
            kvr_buf cut;
            kvr_buf_init(&cut, first.len / 2 ? first.len / 2 : 1);
            int rc = kvr_route_text_build(body, (kvr_route_kind)kind, &cut);
            if (rc != (first.len > cut.cap) || cut.len > cut.cap ||
                (cut.len && memcmp(cut.data, first.data, cut.len) != 0))
                __builtin_trap();
            kvr_buf_free(&cut);
        }
        kvr_buf_free(&first);
    }
}

static void check_validate(const json_t *body)
{
    for (int ep = 0; ep < KVR_EP_COUNT; ep++) {
        char msg[64];
        const char *param = "unset";
        msg[0] = '\0';
        int st = kvr_api_validate(body, (kvr_endpoint)ep, msg, sizeof(msg), &param);
        if (st != 0 && (st != 400 || !msg[0] || strnlen(msg, sizeof(msg)) == sizeof(msg) ||
                        (param && !*param)))
            __builtin_trap();
        /* An accepted body has what routing reads: a string model (or none where the
         * endpoint allows that). */
        const json_t *model = json_object_get(body, "model");
        if (st == 0 && !json_is_string(model) &&
            !(model == NULL && kvr_endpoint_model_optional((kvr_endpoint)ep)))
            __builtin_trap();
    }
}

static void check_model_span(const char *buf, size_t len, const json_t *body)
{
    size_t vlen = 0;
    long at = kvr_json_member_span(buf, len, "model", &vlen);
    if (at < 0)
        return;
    if (!json_is_object(body) || (size_t)at > len || vlen == 0 || vlen > len - (size_t)at)
        __builtin_trap();
    /* a raw "model" key was found, so the parsed object has one (decoded keys match too) */
    if (!json_object_get(body, "model"))
        __builtin_trap();
    json_error_t e;
    json_t *v = json_loadb(buf + at, vlen, JSON_DECODE_ANY, &e);
    if (!v)
        __builtin_trap(); /* the span is not exactly one JSON value */
    json_decref(v);
    /* proxy.c attempt_body(): the body with that value replaced must still parse */
    static const char repl[] = "\"upstream/model\"";
    size_t n = (size_t)at + (sizeof(repl) - 1) + (len - (size_t)at - vlen);
    char *w = malloc(n ? n : 1);
    if (!w)
        abort();
    memcpy(w, buf, (size_t)at);
    memcpy(w + at, repl, sizeof(repl) - 1);
    memcpy(w + at + sizeof(repl) - 1, buf + at + vlen, len - (size_t)at - vlen);
    json_t *re = kvr_json_read(w, n, NULL);
    if (!json_is_object(re))
        __builtin_trap();
    json_decref(re);
    free(w);
}

/* The documented exception: jansson accepted `buf`, the reader did not. True when every NUL
 * byte follows the last byte of a number or literal (a digit, true/false's 'e', null's 'l'),
 * and the input without its NULs reads as jansson's value. (jansson accepted it, so no NUL is
 * inside a string: it would be a control character there.) */
static int jansson_skipped_nul(const char *buf, size_t len, const json_t *ref)
{
    if (!memchr(buf, '\0', len))
        return 0;
    char *w = malloc(len);
    if (!w)
        abort();
    size_t n = 0;
    int ok = 1;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\0') {
            w[n++] = buf[i];
            continue;
        }
        char prev = i ? buf[i - 1] : ' ';
        if (!((prev >= '0' && prev <= '9') || prev == 'e' || prev == 'l'))
            ok = 0;
    }
    json_t *v = ok ? kvr_json_read(w, n, NULL) : NULL;
    ok = v && json_equal(v, ref);
    json_decref(v);
    free(w);
    return ok;
}

static kvr_json_kind kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return KVR_JSON_OBJECT;
    case JSON_ARRAY: return KVR_JSON_ARRAY;
    case JSON_STRING: return KVR_JSON_STRING;
    case JSON_INTEGER: return KVR_JSON_INTEGER;
    case JSON_REAL: return KVR_JSON_REAL;
    case JSON_TRUE: return KVR_JSON_TRUE;
    case JSON_FALSE: return KVR_JSON_FALSE;
    default: return KVR_JSON_NULL;
    }
}

static int is_tok(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0;
}

/* A located value against the tree's value `v` (NULL: absent). */
static void check_span(const char *buf, size_t size, const kvr_json_span *s, const json_t *v)
{
    if (!v) {
        if (s->kind != KVR_JSON_ABSENT || s->len)
            __builtin_trap();
        return;
    }
    if (s->kind != kind_of(v) || s->off > size || s->len == 0 || s->len > size - s->off)
        __builtin_trap();
    json_error_t e;
    json_t *re = json_loadb(buf + s->off, s->len, JSON_DECODE_ANY, &e);
    if (!re || !json_equal(re, v))
        __builtin_trap();
    json_decref(re);
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        char *d = malloc(n + 1);
        if (!d)
            abort();
        if (kvr_json_span_string(buf, s, d, n + 1) != n || memcmp(d, json_string_value(v), n))
            __builtin_trap();
        free(d);
    }
    if (s->ival != (json_is_integer(v) ? json_integer_value(v) : 0))
        __builtin_trap();
    if (!json_is_array(v)) {
        if (s->count || s->nonstring || s->nontoken || s->nontokarr || s->first_norole)
            __builtin_trap();
        return;
    }
    size_t i, ns = 0, nt = 0, nta = 0, norole = json_array_size(v);
    const json_t *el;
    json_array_foreach(v, i, el) {
        ns += !json_is_string(el);
        nt += !is_tok(el);
        size_t k;
        const json_t *t;
        int ta = json_is_array(el) && json_array_size(el) > 0;
        json_array_foreach(el, k, t) ta = ta && is_tok(t);
        nta += !ta;
        if (norole == json_array_size(v) &&
            !(json_is_object(el) && json_is_string(json_object_get(el, "role"))))
            norole = i;
    }
    if (s->count != json_array_size(v) || s->nonstring != ns || s->nontoken != nt ||
        s->nontokarr != nta || s->first_norole != norole)
        __builtin_trap();
}

/* The scan with its 32-byte string path off (16-byte steps only) against `f`, the scan with it
 * on (where the CPU has AVX2): the same acceptance, spans and recorded messages. */
static void check_narrow(const char *buf, size_t size, const kvr_session_sources *src, int rc,
                         const kvr_body_fields *f)
{
    static kvr_body_fields g;
    kvr_json_scan_wide(0);
    int rc2 = kvr_body_fields_scan(&g, buf, size, src);
    kvr_json_scan_wide(1);
    if (rc2 != rc)
        __builtin_trap();
    if (rc < 0)
        return;
    for (size_t i = 0; i < f->n; i++) {
        const kvr_json_span *a = &f->v[i], *b = &g.v[i];
        if (a->off != b->off || a->len != b->len || a->kind != b->kind ||
            a->escaped != b->escaped || a->ival != b->ival || a->count != b->count ||
            a->nonstring != b->nonstring || a->nontoken != b->nontoken ||
            a->nontokarr != b->nontokarr || a->first_norole != b->first_norole)
            __builtin_trap();
    }
    size_t n1, n2;
    const kvr_json_elem *e1 = kvr_body_messages(f, &n1), *e2 = kvr_body_messages(&g, &n2);
    if (n1 != n2)
        __builtin_trap();
    for (size_t i = 0; i < n1; i++)
        if (e1[i].off != e2[i].off || e1[i].len != e2[i].len || e1[i].kind != e2[i].kind)
            __builtin_trap();
}

/* The scan (what the proxy reads) against the tree (`body`, NULL when kvr_json_read refused
 * the input). */
static void check_scan(const char *buf, size_t size, const json_t *body,
                       const kvr_session_sources *src)
{
    static kvr_body_fields f;
    int rc = kvr_body_fields_scan(&f, buf, size, src);
    check_narrow(buf, size, src, rc, &f);
    if ((rc == 0) != (body != NULL))
        __builtin_trap(); /* same acceptance as kvr_json_read */
    if (!body)
        return;
    if (f.object != json_is_object(body))
        __builtin_trap();
    for (size_t i = 0; i < f.n; i++)
        check_span(buf, size, &f.v[i], json_object_get(body, f.names[i]));
    for (int ep = 0; ep < KVR_EP_COUNT; ep++) {
        char m1[300] = "", m2[300] = "";
        const char *p1 = "unset", *p2 = "unset";
        int s1 = kvr_api_validate(body, (kvr_endpoint)ep, m1, sizeof(m1), &p1);
        int s2 = kvr_api_validate_fields(&f, (kvr_endpoint)ep, m2, sizeof(m2), &p2);
        if (s1 != s2 || strcmp(m1, m2) != 0 || (p1 != p2 && (!p1 || !p2 || strcmp(p1, p2))))
            __builtin_trap();
    }
    const hdrs sets[] = {{g_plain}, {g_conv}, {g_long}};
    for (size_t h = 0; h < sizeof(sets) / sizeof(sets[0]); h++) {
        kvr_buf a, b;
        kvr_buf_init(&a, 0);
        kvr_buf_init(&b, 0);
        int ra = kvr_session_key_build(body, get_hdr, (void *)&sets[h], src, &a);
        int rb = kvr_body_session_key(&f, get_hdr, (void *)&sets[h], src, &b);
        if (ra != rb || a.len != b.len || (a.len && memcmp(a.data, b.data, a.len)))
            __builtin_trap();
        kvr_buf_free(&a);
        kvr_buf_free(&b);
    }
    size_t plen = 0;
    const char *prev = kvr_route_previous_response_id(body, &plen);
    char *dup = NULL;
    size_t dlen = 0;
    int dr = kvr_body_strdup(&f, KVR_FIELD_PREVIOUS_RESPONSE_ID, &dup, &dlen);
    if (dr < 0)
        abort();
    /* keys.h takes a non-empty string only; the scan gives any string */
    if (prev && (!dup || dlen != plen || memcmp(dup, prev, plen)))
        __builtin_trap();
    if (!prev && dup && dlen)
        __builtin_trap();
    free(dup);
    const json_t *mt = json_object_get(body, "max_tokens");
    const json_t *mct = json_object_get(body, "max_completion_tokens");
    if (kvr_body_integer(&f, KVR_FIELD_MAX_TOKENS) != json_integer_value(mt) ||
        kvr_body_integer(&f, KVR_FIELD_MAX_COMPLETION_TOKENS) != json_integer_value(mct))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_session_sources src, deep;
    if (!src.n) {
        kvr_session_sources_default(&src);
        /* nested paths and a fixed field as a session source */
        if (kvr_session_sources_parse(&deep, "body:a.b.c,body:session_params.session_id.x,"
                                      "body:model,header:x-session-id", NULL, 0) < 0)
            abort();
        memset(g_long_id, 's', sizeof(g_long_id) - 1);
    }
    const char *buf = (const char *)data;

    json_error_t e1, e2;
    json_t *body = kvr_json_read(buf, size, &e1);
    json_t *ref = json_loadb(buf, size, 0, &e2);
    if ((body == NULL) != (ref == NULL) || (body && !json_equal(body, ref))) {
        if (body || !jansson_skipped_nul(buf, size, ref))
            abort(); /* json_read.h: same acceptance and values as json_loadb(…, 0, …) */
    }
    json_decref(ref);
    check_scan(buf, size, body, &src);
    check_scan(buf, size, body, &deep);
    if (!body) {
        if (!e1.text[0] || e1.line < 1 || e1.column < 1 || e1.position < 0 ||
            (size_t)e1.position > size)
            __builtin_trap();
        return 0;
    }

    check_keys(body, &src);
    check_validate(body);
    size_t idlen = 0;
    const char *prev = kvr_route_previous_response_id(body, &idlen);
    if (prev && (!idlen || strlen(prev) != idlen))
        __builtin_trap();
    const char *rid = kvr_route_response_id(body, &idlen);
    if (rid && (!idlen || strlen(rid) != idlen))
        __builtin_trap();
    check_model_span(buf, size, body);
    json_decref(body);
    return 0;
}
