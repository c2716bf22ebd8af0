/* Top-level member edits over a client's JSON bytes (see body_edit.h). */
#include "proxy/body_edit.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "util/json_read.h"

#define MAX_EDITS 16

/* The first edit naming member `m`, or -1. */
static int edit_of(const char *body, const kvr_json_member *m, const kvr_body_edit *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvr_json_member_is(body, m, e[i].key))
            return (int)i;
    return -1;
}

int kvr_body_edit_apply(const char *body, size_t len, const kvr_body_edit *e, size_t n,
                        kvr_buf *out)
{
    kvr_buf_reset(out);
    if (n > MAX_EDITS)
        return -1;
    int seen[MAX_EDITS] = {0};
    size_t pos = 0, prev_end = 0, kept = 0, members = 0;
    kvr_json_member m;
    int rc, ok = 1;
    while ((rc = kvr_json_member_next(body, len, &pos, &m)) == 1) {
        if (!members++)
            ok &= kvr_buf_append(out, body, m.start) == 0; /* up to the first key */
        size_t sep = prev_end; /* the previous member's end: its comma follows */
        prev_end = m.end;
        int k = edit_of(body, &m, e, n);
        if (k >= 0)
            seen[k] = 1;
        if (k >= 0 && !e[k].value)
            continue;
        /* The separator that preceded it in the body (one comma, the client's blanks); the
         * first member kept needs none. */
        if (kept++)
            ok &= kvr_buf_append(out, body + sep, m.start - sep) == 0;
        if (k >= 0) {
            ok &= kvr_buf_append(out, body + m.start, m.value - m.start) == 0;
            ok &= kvr_buf_append(out, e[k].value, e[k].len) == 0;
        } else {
            ok &= kvr_buf_append(out, body + m.start, m.end - m.start) == 0;
        }
    }
    if (rc < 0)
        return -1;
    if (!members) { /* an empty object: new members go right after its brace */
        const char *b = memchr(body, '{', len);
        prev_end = (size_t)(b - body) + 1;
        ok &= kvr_buf_append(out, body, prev_end) == 0;
    }
    for (size_t i = 0; i < n; i++) {
        int dup = 0; /* a key given twice is written once */
        for (size_t j = 0; j < i; j++)
            dup |= strcmp(e[j].key, e[i].key) == 0;
        if (seen[i] || !e[i].value || e[i].if_present || dup)
            continue;
        if (kept++)
            ok &= kvr_buf_append(out, ",", 1) == 0;
        ok &= kvr_buf_printf(out, "\"%s\":", e[i].key) == 0;
        ok &= kvr_buf_append(out, e[i].value, e[i].len) == 0;
    }
    ok &= kvr_buf_append(out, body + prev_end, len - prev_end) == 0;
    return ok ? 0 : -1;
}

int kvr_body_edit_model(const char *target_model, const char *client_model, char **enc,
                        kvr_body_edit *e)
{
    *enc = NULL;
    if (!client_model || strcmp(target_model, client_model) == 0)
        return 0;
    json_t *s = json_string(target_model);
    *enc = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (!*enc)
        return -1;
    *e = (kvr_body_edit){"model", *enc, strlen(*enc), 1};
    return 1;
}
