/* The routing text's writer and framing. See text_writer.h. */
#include "routing/text_writer.h"

#include <stdio.h>
#include <string.h>

void kvr_text_put(kvr_text_writer *w, const void *p, size_t n)
{
    if (w->cut || w->oom || !n)
        return;
    size_t room = n;
    if (w->b->cap) {
        room = w->b->cap > w->b->len ? w->b->cap - w->b->len : 0;
        if (room > n)
            room = n;
    }
    if (room && kvr_buf_append(w->b, p, room) < 0) {
        w->oom = 1;
        return;
    }
    if (room < n)
        w->cut = 1;
}

void kvr_text_putc(kvr_text_writer *w, char c)
{
    kvr_text_put(w, &c, 1);
}

void kvr_text_field(kvr_text_writer *w, char tag)
{
    char f[2] = {KVR_TEXT_US, tag};
    kvr_text_put(w, f, 2);
}

void kvr_text_rec_start(kvr_text_writer *w, const char *tag, size_t n)
{
    kvr_text_putc(w, KVR_TEXT_RS);
    kvr_text_put(w, tag, n);
}

void kvr_text_rec_start_s(kvr_text_writer *w, const char *tag)
{
    kvr_text_rec_start(w, tag, strlen(tag));
}

void kvr_text_rec_end(kvr_text_writer *w)
{
    kvr_text_putc(w, KVR_TEXT_GS);
}

static int canon_cb(const char *p, size_t n, void *ud)
{
    kvr_text_writer *w = ud;
    kvr_text_put(w, p, n);
    return w->cut || w->oom ? -1 : 0; /* stop dumping once nothing more can be kept */
}

void kvr_text_canon(kvr_text_writer *w, const json_t *v)
{
    if (json_dump_callback(v, canon_cb, w, KVR_TEXT_CANON) < 0 && !w->cut)
        w->oom = 1;
}

void kvr_text_hex128(XXH128_hash_t h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

static int hash_cb(const char *p, size_t n, void *ud)
{
    return XXH3_128bits_update(ud, p, n) == XXH_OK ? 0 : -1;
}

int kvr_text_canon_digest(const json_t *v, char out[33])
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -1;
    XXH3_128bits_reset(st);
    int rc = json_dump_callback(v, hash_cb, st, KVR_TEXT_CANON);
    if (rc == 0)
        kvr_text_hex128(XXH3_128bits_digest(st), out);
    XXH3_freeState(st);
    return rc;
}

void kvr_text_digest_field(kvr_text_writer *w, const json_t *v)
{
    char hx[33];
    if (kvr_text_canon_digest(v, hx) < 0) {
        w->oom = 1;
        return;
    }
    kvr_text_field(w, 'x');
    kvr_text_put(w, hx, 32);
}
