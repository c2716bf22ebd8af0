/* libFuzzer harness for what kvroute reads from Redis and its --redis URL (src/cluster/
 * entry.c): any stream entry's fields (which any Redis client may have written) and any URL
 * must never crash, leak or invoke undefined behaviour.
 *
 * Input: the first byte selects the target. 0: the rest is a URL (NUL-terminated copy).
 * Otherwise the rest is split at 0x00 bytes into field strings (names and values alternating,
 * at most 64), decoded as a stream entry. Checked contracts (cluster/entry.h):
 *  - a decoded entry's ranges lie inside the input, its keys are whole 8-byte keys, its
 *    names within KVR_ENTRY_MAX_NAME;
 *  - a decoded entry encodes again, and that frame decodes to the same entry (same type,
 *    names, ts, block size, keys and session). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/entry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FIELDS 64

static int inside(const void *p, size_t n, const uint8_t *base, size_t size)
{
    const uint8_t *q = p;
    return n == 0 || (q >= base && q + n <= base + size);
}

static void same(const kvr_entry *a, const kvr_entry *b)
{
    if (a->type != b->type || a->ts_ms != b->ts_ms || a->worker_len != b->worker_len ||
        memcmp(a->worker, b->worker, a->worker_len) || a->replica_len != b->replica_len ||
        memcmp(a->replica, b->replica, a->replica_len) || a->has_session != b->has_session ||
        (a->has_session && memcmp(a->session, b->session, 16)) || a->ttl_s != b->ttl_s)
        abort();
    if (a->keep_blocks != b->keep_blocks)
        abort();
    if (a->type == KVR_ENTRY_TEACH || a->type == KVR_ENTRY_CORRECT) {
        if (a->route_len != b->route_len || memcmp(a->route, b->route, a->route_len) ||
            a->nkeys != b->nkeys || (a->nkeys && memcmp(a->keys, b->keys, a->nkeys * 8)) ||
            (a->nkeys && a->block_bytes != b->block_bytes))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    if (data[0] == 0) {
        char *u = malloc(size);
        if (!u)
            return 0;
        memcpy(u, data + 1, size - 1);
        u[size - 1] = '\0';
        kvr_redis_url url;
        char err[300];
        if (kvr_redis_url_parse(u, &url, err, sizeof(err)) == 0 &&
            (url.port < 1 || url.port > 65535 || !url.host[0]))
            abort();
        free(u);
        return 0;
    }
    const char *f[MAX_FIELDS];
    size_t fl[MAX_FIELDS], n = 0;
    const uint8_t *p = data + 1, *end = data + size;
    while (p <= end && n < MAX_FIELDS) {
        const uint8_t *z = memchr(p, 0, (size_t)(end - p));
        const uint8_t *e = z ? z : end;
        f[n] = (const char *)p;
        fl[n++] = (size_t)(e - p);
        if (!z)
            break;
        p = z + 1;
    }
    kvr_entry e;
    if (kvr_entry_decode(f, fl, n, &e) != 0)
        return 0;
    if (!inside(e.worker, e.worker_len, data, size) || !inside(e.replica, e.replica_len, data, size) ||
        !inside(e.route, e.route_len, data, size) || !inside(e.keys, e.nkeys * 8, data, size) ||
        e.worker_len > KVR_ENTRY_MAX_NAME || e.replica_len > KVR_ENTRY_MAX_NAME ||
        e.nkeys > KVR_ENTRY_MAX_KEYS)
        abort();
    for (size_t i = 0; i < e.nkeys; i++)
        (void)kvr_entry_key(&e, i);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    if (kvr_entry_encode(&e, KVR_ENTRY_MAX_KEYS, &b) != 0)
        abort();
    const char *argv[KVR_ENTRY_MAX_FIELDS];
    size_t lens[KVR_ENTRY_MAX_FIELDS], off = 0;
    size_t m = kvr_entry_frame_next(b.data, b.len, &off, argv, lens);
    kvr_entry d;
    if (!m || off != b.len || kvr_entry_decode(argv, lens, m, &d) != 0)
        abort();
    same(&e, &d);
    kvr_buf_free(&b);
    return 0;
}
