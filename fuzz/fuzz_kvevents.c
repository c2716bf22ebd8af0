/* libFuzzer harness for the vLLM KV-event batch decoder (src/events/decode.c): whatever
 * payload a worker's PUB socket delivers must be decoded or refused without a crash, leak or
 * undefined behaviour, and a decoded batch must be what decode.h describes.
 *
 * Checks besides that:
 * - a refusal comes with a reason; the same bytes are refused with no err buffer and with an
 *   8-byte one too (reason truncated and NUL-terminated), and accepted ones decode the same
 *   way every time;
 * - a batch is one allocation laid out batch | events | hashes | tokens: each event's hash
 *   and token arrays lie inside the batch's hash and token arrays, in wire order, without
 *   overlap, and every element is read (so ASan sees any pointer that strays);
 * - counts are consistent: a pointer is NULL exactly when its count is 0, and every event
 *   (known or unknown), hash and token took at least one payload byte;
 * - enums are in range and name themselves; BlockRemoved has no parent, tokens or block size;
 *   AllBlocksCleared has nothing; has_parent means a non-zero parent. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "events/decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink; /* keeps the reads of every element */

static void check_ptr(const void *p, size_t n, uintptr_t *cursor, uintptr_t end, size_t elem)
{
    if ((p == NULL) != (n == 0))
        __builtin_trap();
    if (!p)
        return;
    uintptr_t a = (uintptr_t)p;
    if (a < *cursor || a % elem || n > (end - a) / elem)
        __builtin_trap();
    *cursor = a + n * elem;
}

static void check(const kvr_kv_batch *b, size_t size)
{
    if ((b->events == NULL) != (b->nevents == 0) || b->nevents + b->unknown > size)
        __builtin_trap();
    const kvr_kv_event *ev = (const kvr_kv_event *)(b + 1);
    if (b->events && b->events != ev)
        __builtin_trap();
    size_t nh = 0, nt = 0;
    for (size_t i = 0; i < b->nevents; i++) {
        nh += b->events[i].nhashes;
        nt += b->events[i].ntokens;
    }
    if (nh > size || nt > size || nh + nt > size)
        __builtin_trap();
    const uint64_t *hbase = (const uint64_t *)(ev + b->nevents);
    const uint32_t *tbase = (const uint32_t *)(hbase + nh);
    uintptr_t hcur = (uintptr_t)hbase, hend = (uintptr_t)(hbase + nh);
    uintptr_t tcur = (uintptr_t)tbase, tend = (uintptr_t)(tbase + nt);
    uint64_t acc = 0;
    for (size_t i = 0; i < b->nevents; i++) {
        const kvr_kv_event *e = &b->events[i];
        if ((unsigned)e->type >= KVR_KV_EV_NTYPES || (unsigned)e->medium >= KVR_KV_NMEDIA ||
            !kvr_kv_ev_type_name(e->type) || !kvr_kv_medium_name(e->medium))
            __builtin_trap();
        check_ptr(e->hashes, e->nhashes, &hcur, hend, sizeof(uint64_t));
        check_ptr(e->tokens, e->ntokens, &tcur, tend, sizeof(uint32_t));
        if ((e->has_parent != 0 && e->has_parent != 1) || (e->has_parent && !e->parent))
            __builtin_trap();
        if (e->type != KVR_KV_EV_STORED && (e->has_parent || e->ntokens || e->block_size))
            __builtin_trap();
        if (e->type == KVR_KV_EV_CLEARED &&
            (e->nhashes || e->medium != KVR_KV_GPU || e->group_idx != -1))
            __builtin_trap();
        for (size_t k = 0; k < e->nhashes; k++)
            acc += e->hashes[k];
        for (size_t k = 0; k < e->ntokens; k++)
            acc += e->tokens[k];
    }
    g_sink = acc;
}

static int same(const kvr_kv_batch *a, const kvr_kv_batch *b)
{
    if (memcmp(&a->ts, &b->ts, sizeof(a->ts)) != 0 || a->dp_rank != b->dp_rank ||
        a->nevents != b->nevents || a->unknown != b->unknown)
        return 0;
    for (size_t i = 0; i < a->nevents; i++) {
        const kvr_kv_event *x = &a->events[i], *y = &b->events[i];
        if (x->type != y->type || x->medium != y->medium || x->nhashes != y->nhashes ||
            x->has_parent != y->has_parent || x->parent != y->parent ||
            x->ntokens != y->ntokens || x->block_size != y->block_size ||
            x->group_idx != y->group_idx ||
            (x->nhashes && memcmp(x->hashes, y->hashes, x->nhashes * sizeof(uint64_t))) ||
            (x->ntokens && memcmp(x->tokens, y->tokens, x->ntokens * sizeof(uint32_t))))
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[128], small[8];
    err[0] = 'x';
    kvr_kv_batch *b = kvr_kv_decode(data, size, err, sizeof(err));
    kvr_kv_batch *again = kvr_kv_decode(data, size, NULL, 0);
    memset(small, 'x', sizeof(small));
    kvr_kv_batch *tiny = kvr_kv_decode(data, size, small, sizeof(small));
    if ((b == NULL) != (again == NULL) || (b == NULL) != (tiny == NULL))
        __builtin_trap();
    if (!b) {
        if (!err[0] || !memchr(err, '\0', sizeof(err)) || !small[0] ||
            !memchr(small, '\0', sizeof(small)))
            __builtin_trap();
        return 0;
    }
    check(b, size);
    if (!same(b, again) || !same(b, tiny))
        __builtin_trap();
    kvr_kv_batch_free(b);
    kvr_kv_batch_free(again);
    kvr_kv_batch_free(tiny);
    return 0;
}
