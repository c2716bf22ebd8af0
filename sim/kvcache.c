/* KV block pool: free queue (intrusive doubly-linked list), hash → blocks table (open
 * addressing, linear probing, backward-shift deletion; duplicates chained through the blocks). */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NIL UINT32_MAX

typedef struct blk {
    uint64_t hash;
    uint32_t ref;
    uint32_t prev, next; /* free-queue links; NIL when not queued */
    uint32_t dup_next;   /* next block with the same hash */
    uint8_t cached;
    uint8_t queued;
} blk;

struct kvr_sim_kv {
    uint32_t n, bs;
    blk *b;          /* n + 1 entries; b[n] is the free-queue sentinel */
    uint32_t nfree, nused, ncached;
    uint64_t *keys;  /* table of cached hashes */
    uint32_t *vals;  /* head block of the hash's chain, NIL = empty slot */
    size_t mask;
    uint64_t root;
    uint64_t evictions;
    kvr_sim_kv_sink sink;
};

static size_t slot_of(const kvr_sim_kv *kv, uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & kv->mask;
}

static size_t find_slot(const kvr_sim_kv *kv, uint64_t h)
{
    size_t i = slot_of(kv, h);
    while (kv->vals[i] != NIL && kv->keys[i] != h)
        i = (i + 1) & kv->mask;
    return i;
}

static void table_delete(kvr_sim_kv *kv, size_t i)
{
    /* Backward-shift deletion keeps probe runs intact without tombstones. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & kv->mask;
        if (kv->vals[j] == NIL)
            break;
        size_t home = slot_of(kv, kv->keys[j]);
        /* move j to i if its home is not within (i, j] cyclically */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            kv->keys[i] = kv->keys[j];
            kv->vals[i] = kv->vals[j];
            i = j;
        }
    }
    kv->vals[i] = NIL;
}

static void queue_push_tail(kvr_sim_kv *kv, uint32_t x)
{
    uint32_t s = kv->n, last = kv->b[s].prev;
    kv->b[x].prev = last;
    kv->b[x].next = s;
    kv->b[last].next = x;
    kv->b[s].prev = x;
    kv->b[x].queued = 1;
    kv->nfree++;
}

static void queue_remove(kvr_sim_kv *kv, uint32_t x)
{
    kv->b[kv->b[x].prev].next = kv->b[x].next;
    kv->b[kv->b[x].next].prev = kv->b[x].prev;
    kv->b[x].prev = kv->b[x].next = NIL;
    kv->b[x].queued = 0;
    kv->nfree--;
}

kvr_sim_kv *kvr_sim_kv_new(uint32_t nblocks, uint32_t block_size, uint64_t hash_seed)
{
    if (nblocks == 0 || nblocks >= NIL || block_size == 0)
        return NULL;
    kvr_sim_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return NULL;
    kv->n = nblocks;
    kv->bs = block_size;
    size_t cap = 16;
    while (cap < (size_t)nblocks * 2)
        cap *= 2;
    kv->mask = cap - 1;
    kv->b = calloc((size_t)nblocks + 1, sizeof(blk));
    kv->keys = calloc(cap, sizeof(uint64_t));
    kv->vals = malloc(cap * sizeof(uint32_t));
    if (!kv->b || !kv->keys || !kv->vals) {
        kvr_sim_kv_free_pool(kv);
        return NULL;
    }
    memset(kv->vals, 0xff, cap * sizeof(uint32_t));
    kv->b[nblocks].prev = kv->b[nblocks].next = nblocks;
    for (uint32_t i = 0; i < nblocks; i++) {
        kv->b[i].dup_next = NIL;
        queue_push_tail(kv, i);
    }
    /* NONE_HASH: vLLM hashes the PYTHONHASHSEED string; we hash the seed's 8 bytes. */
    kv->root = XXH3_64bits(&hash_seed, sizeof(hash_seed));
    return kv;
}

void kvr_sim_kv_free_pool(kvr_sim_kv *kv)
{
    if (!kv)
        return;
    free(kv->b);
    free(kv->keys);
    free(kv->vals);
    free(kv);
}

void kvr_sim_kv_set_sink(kvr_sim_kv *kv, const kvr_sim_kv_sink *sink)
{
    if (sink)
        kv->sink = *sink;
    else
        memset(&kv->sink, 0, sizeof(kv->sink));
}

uint32_t kvr_sim_kv_block_size(const kvr_sim_kv *kv)
{
    return kv->bs;
}
uint32_t kvr_sim_kv_num_blocks(const kvr_sim_kv *kv)
{
    return kv->n;
}
uint32_t kvr_sim_kv_num_free(const kvr_sim_kv *kv)
{
    return kv->nfree;
}
uint32_t kvr_sim_kv_num_used(const kvr_sim_kv *kv)
{
    return kv->nused;
}
uint32_t kvr_sim_kv_num_cached(const kvr_sim_kv *kv)
{
    return kv->ncached;
}
double kvr_sim_kv_usage(const kvr_sim_kv *kv)
{
    return (double)kv->nused / (double)kv->n;
}
uint64_t kvr_sim_kv_evictions(const kvr_sim_kv *kv)
{
    return kv->evictions;
}
uint64_t kvr_sim_kv_root_hash(const kvr_sim_kv *kv)
{
    return kv->root;
}

uint64_t kvr_sim_kv_hash_block(const kvr_sim_kv *kv, uint64_t parent, const uint32_t *tokens)
{
    return XXH3_64bits_withSeed(tokens, (size_t)kv->bs * sizeof(uint32_t), parent);
}

static uint32_t lookup(const kvr_sim_kv *kv, uint64_t h)
{
    return kv->vals[find_slot(kv, h)];
}

size_t kvr_sim_kv_longest_hit(const kvr_sim_kv *kv, const uint64_t *hashes, size_t n,
                              uint32_t *out)
{
    size_t i = 0;
    for (; i < n; i++) {
        uint32_t b = lookup(kv, hashes[i]);
        if (b == NIL)
            break;
        out[i] = b;
    }
    return i;
}

size_t kvr_sim_kv_count_free(const kvr_sim_kv *kv, const uint32_t *blocks, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += kv->b[blocks[i]].ref == 0;
    return c;
}

void kvr_sim_kv_touch(kvr_sim_kv *kv, const uint32_t *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        blk *x = &kv->b[blocks[i]];
        if (x->ref++ == 0) {
            queue_remove(kv, blocks[i]);
            kv->nused++;
        }
    }
}

/* Drops block x's hash from the table (x stays wherever it is in the queue). */
static void uncache(kvr_sim_kv *kv, uint32_t x)
{
    blk *b = &kv->b[x];
    size_t i = find_slot(kv, b->hash);
    uint32_t head = kv->vals[i];
    if (head == x) {
        if (b->dup_next == NIL)
            table_delete(kv, i);
        else
            kv->vals[i] = b->dup_next;
    } else {
        uint32_t p = head;
        while (p != NIL && kv->b[p].dup_next != x)
            p = kv->b[p].dup_next;
        if (p != NIL)
            kv->b[p].dup_next = b->dup_next;
    }
    b->dup_next = NIL;
    b->cached = 0;
    kv->ncached--;
}

static void evict(kvr_sim_kv *kv, uint32_t x)
{
    uint64_t h = kv->b[x].hash;
    uncache(kv, x);
    kv->evictions++;
    if (kv->sink.removed)
        kv->sink.removed(kv->sink.ud, h);
}

int kvr_sim_kv_alloc(kvr_sim_kv *kv, size_t n, uint32_t *out)
{
    if (n > kv->nfree)
        return -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t x = kv->b[kv->n].next;
        queue_remove(kv, x);
        blk *b = &kv->b[x];
        if (b->cached)
            evict(kv, x);
        b->ref = 1;
        kv->nused++;
        out[i] = x;
    }
    return 0;
}

void kvr_sim_kv_cache(kvr_sim_kv *kv, const uint32_t *blocks, const uint64_t *hashes, size_t n,
                      int has_parent, uint64_t parent, const uint32_t *tokens)
{
    if (n == 0)
        return;
    for (size_t k = 0; k < n; k++) {
        uint32_t x = blocks[k];
        blk *b = &kv->b[x];
        if (b->cached)
            uncache(kv, x); /* defensive: a block holds one hash */
        b->hash = hashes[k];
        b->cached = 1;
        kv->ncached++;
        size_t i = find_slot(kv, hashes[k]);
        if (kv->vals[i] == NIL) {
            kv->keys[i] = hashes[k];
            b->dup_next = NIL;
        } else {
            b->dup_next = kv->vals[i];
        }
        kv->vals[i] = x;
    }
    if (kv->sink.stored)
        kv->sink.stored(kv->sink.ud, hashes, n, has_parent, parent, tokens, n * kv->bs, kv->bs);
}

void kvr_sim_kv_release(kvr_sim_kv *kv, const uint32_t *blocks, size_t n)
{
    for (size_t k = n; k-- > 0;) {
        blk *b = &kv->b[blocks[k]];
        if (b->ref == 0)
            continue; /* defensive: never double-queue */
        if (--b->ref == 0) {
            kv->nused--;
            queue_push_tail(kv, blocks[k]);
        }
    }
}

size_t kvr_sim_kv_evict_free(kvr_sim_kv *kv)
{
    size_t n = 0;
    for (uint32_t x = kv->b[kv->n].next; x != kv->n; x = kv->b[x].next)
        if (kv->b[x].cached) {
            evict(kv, x);
            n++;
        }
    return n;
}

int kvr_sim_kv_reset(kvr_sim_kv *kv)
{
    if (kv->nused)
        return -1;
    for (uint32_t i = 0; i < kv->n; i++) {
        kv->b[i].cached = 0;
        kv->b[i].dup_next = NIL;
    }
    memset(kv->vals, 0xff, (kv->mask + 1) * sizeof(uint32_t));
    kv->ncached = 0;
    if (kv->sink.cleared)
        kv->sink.cleared(kv->sink.ud);
    return 0;
}
