/* Request-body fields from one scan. See fields.h. */
#include "routing/fields.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define CANON (JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)

static const char *const g_fixed[KVR_FIELD_COUNT] = {
    [KVR_FIELD_MODEL] = "model",
    [KVR_FIELD_STREAM] = "stream",
    [KVR_FIELD_STREAM_OPTIONS] = "stream_options",
    [KVR_FIELD_MESSAGES] = "messages",
    [KVR_FIELD_PROMPT] = "prompt",
    [KVR_FIELD_INPUT] = "input",
    [KVR_FIELD_TOKENS] = "tokens",
    [KVR_FIELD_SYSTEM] = "system",
    [KVR_FIELD_TOOLS] = "tools",
    [KVR_FIELD_QUERY] = "query",
    [KVR_FIELD_DOCUMENTS] = "documents",
    [KVR_FIELD_TEXT_1] = "text_1",
    [KVR_FIELD_TEXT_2] = "text_2",
    [KVR_FIELD_MAX_TOKENS] = "max_tokens",
    [KVR_FIELD_MAX_COMPLETION_TOKENS] = "max_completion_tokens",
    [KVR_FIELD_PREVIOUS_RESPONSE_ID] = "previous_response_id",
    [KVR_FIELD_FUNCTIONS] = "functions",
};

/* Index of `name` (`n` bytes) among the names of f, or -1. */
static long name_index(const kvr_body_fields *f, const char *name, size_t n)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->names[i][0] == (n ? name[0] : '\0') && strncmp(f->names[i], name, n) == 0 &&
            f->names[i][n] == '\0')
            return (long)i;
    return -1;
}

/* Which first segments a source list adds to the fixed names (those not already looked
 * for), worked out once per distinct list: the router passes the same configured list request
 * after request, and matching every body path against every name cost ~1,700 instructions a
 * request. */
static struct {
    int valid;
    kvr_session_sources src;
    size_t nseg;
    unsigned char from[KVR_SESSION_SOURCES_MAX]; /* the source each segment comes from */
    unsigned char len[KVR_SESSION_SOURCES_MAX];  /* its first segment's length */
    signed char name[KVR_SESSION_SOURCES_MAX];   /* each source's first segment in names[]
                                                    (-1: a header) */
} g_plan;

static int same_sources(const kvr_session_sources *a, const kvr_session_sources *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->src[i].header != b->src[i].header || strcmp(a->src[i].name, b->src[i].name))
            return 0;
    return 1;
}

static void plan(kvr_body_fields *f, const kvr_session_sources *src)
{
    g_plan.valid = 0;
    g_plan.nseg = 0;
    for (size_t i = 0; i < src->n && i < KVR_SESSION_SOURCES_MAX; i++) {
        const kvr_session_source *s = &src->src[i];
        g_plan.name[i] = -1;
        if (s->header)
            continue;
        const char *dot = strchr(s->name, '.');
        size_t n = dot ? (size_t)(dot - s->name) : strlen(s->name);
        long j = name_index(f, s->name, n);
        if (j >= 0 || g_plan.nseg == KVR_SESSION_SOURCES_MAX) {
            g_plan.name[i] = (signed char)j;
            continue;
        }
        g_plan.name[i] = (signed char)f->n;
        size_t k = g_plan.nseg++;
        g_plan.from[k] = (unsigned char)i;
        g_plan.len[k] = (unsigned char)n;
        /* later sources are matched against this one too */
        memcpy(f->seg[k], s->name, n);
        f->seg[k][n] = '\0';
        f->names[f->n++] = f->seg[k];
    }
    f->n = KVR_FIELD_COUNT;
    g_plan.src = *src;
    g_plan.valid = 1;
}

int kvr_body_fields_scan(kvr_body_fields *f, const char *buf, size_t len,
                         const kvr_session_sources *src)
{
    return kvr_body_fields_scan_known(f, buf, len, src, NULL);
}

int kvr_body_fields_scan_known(kvr_body_fields *f, const char *buf, size_t len,
                               const kvr_session_sources *src, const kvr_json_known *known)
{
    kvr_session_sources def;
    if (!src) {
        kvr_session_sources_default(&def);
        src = &def;
    }
    f->buf = buf;
    f->len = len;
    f->n = KVR_FIELD_COUNT;
    memcpy(f->names, g_fixed, sizeof(g_fixed));
    if (!g_plan.valid || !same_sources(&g_plan.src, src))
        plan(f, src);
    for (size_t k = 0; k < g_plan.nseg; k++) {
        memcpy(f->seg[k], src->src[g_plan.from[k]].name, g_plan.len[k]);
        f->seg[k][g_plan.len[k]] = '\0';
        f->names[f->n++] = f->seg[k];
    }
    f->src = src == &def ? NULL : src;
    memcpy(f->src_name, g_plan.name, sizeof(f->src_name));
    int top = kvr_json_scan_known(buf, len, f->names, f->n, f->v, KVR_FIELD_MESSAGES, f->msgs,
                                  KVR_BODY_MESSAGES_MAX, known);
    f->object = top == KVR_JSON_OBJECT;
    return top < 0 ? -1 : 0;
}

const kvr_json_elem *kvr_body_messages(const kvr_body_fields *f, size_t *n)
{
    const kvr_json_span *m = &f->v[KVR_FIELD_MESSAGES];
    *n = m->kind != KVR_JSON_ARRAY              ? 0
         : m->count < KVR_BODY_MESSAGES_MAX ? m->count
                                            : KVR_BODY_MESSAGES_MAX;
    return f->msgs;
}

const kvr_json_span *kvr_body_field(const kvr_body_fields *f, kvr_field which)
{
    return &f->v[which];
}

int kvr_body_strdup(const kvr_body_fields *f, kvr_field which, char **out, size_t *len)
{
    const kvr_json_span *s = &f->v[which];
    *out = NULL;
    if (s->kind != KVR_JSON_STRING)
        return 0;
    char *d = malloc(s->len); /* decoded bytes never outnumber the quoted ones */
    if (!d)
        return -1;
    size_t n = kvr_json_span_string(f->buf, s, d, s->len);
    d[n] = '\0';
    *out = d;
    if (len)
        *len = n;
    return 1;
}

long long kvr_body_integer(const kvr_body_fields *f, kvr_field which)
{
    return f->v[which].kind == KVR_JSON_INTEGER ? f->v[which].ival : 0;
}

/* The value at a dotted body path, or a span of kind KVR_JSON_ABSENT. */
static kvr_json_span body_path(const kvr_body_fields *f, const char *path, long i)
{
    kvr_json_span v = {0};
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    if (i < 0 && f)
        i = name_index(f, path, n);
    if (i < 0)
        return v;
    v = f->v[i];
    while (dot && v.kind != KVR_JSON_ABSENT) {
        path = dot + 1;
        dot = strchr(path, '.');
        n = dot ? (size_t)(dot - path) : strlen(path);
        char seg[KVR_SESSION_SOURCE_NAME_MAX + 1];
        memcpy(seg, path, n);
        seg[n] = '\0';
        kvr_json_span inner;
        kvr_json_span_member(f->buf, &v, seg, &inner);
        v = inner;
    }
    return v;
}

/* A non-string session value counts by its canonical JSON text (keys.h). */
static int put_canon(const kvr_body_fields *f, const kvr_json_span *v, kvr_buf *out)
{
    json_error_t e;
    json_t *j = json_loadb(f->buf + v->off, v->len, JSON_DECODE_ANY, &e);
    char *txt = j ? json_dumps(j, CANON) : NULL;
    json_decref(j);
    if (!txt)
        return -1;
    int rc = kvr_session_key_append(out, txt, strlen(txt));
    free(txt);
    return rc;
}

int kvr_body_session_key(const kvr_body_fields *f, kvr_header_get_fn get, void *ctx,
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
        kvr_json_span v = body_path(f, s->name, f && src == f->src ? f->src_name[i] : -1);
        if (v.kind == KVR_JSON_ABSENT || v.kind == KVR_JSON_NULL)
            continue;
        if (v.kind != KVR_JSON_STRING)
            return put_canon(f, &v, out) < 0 ? -1 : 1;
        if (v.len == 2)
            continue; /* "" means no session */
        if (!v.escaped)
            return kvr_session_key_append(out, f->buf + v.off + 1, v.len - 2) < 0 ? -1 : 1;
        char *d = malloc(v.len);
        if (!d)
            return -1;
        size_t n = kvr_json_span_string(f->buf, &v, d, v.len);
        int rc = kvr_session_key_append(out, d, n);
        free(d);
        return rc < 0 ? -1 : 1;
    }
    return 0;
}
