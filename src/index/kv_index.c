/* KV block index: two open-addressing tables (linear probing, backward-shift deletion, so no
 * tombstones accumulate under the steady store/remove churn of a busy engine) and a record per
 * worker. See kv_index.h for the contract.
 *
 * Engine table, one slot per (worker, engine hash): the router key it names and how many
 * copies each tier holds. A worker's engine slots form an intrusive list, so forgetting a
 * worker costs its own entries, not a scan of the fleet's.
 *
 * Key table, one slot per (worker, router key) that is held or speculated: per tier, how many
 * of the worker's engine slots naming this key hold copies there (the key is held in a tier
 * while that is non-zero), and the speculative expiry (0 = a real entry). Invariant: a slot is
 * either real (some count non-zero, expiry 0) or speculative (counts zero, expiry set), never
 * both, because a store settles the speculation and speculation leaves real keys alone.
 * A worker's speculative slots form a list ordered by expiry, so a sweep stops at the first
 * live one and forgetting a worker reaches its speculative keys, which no engine slot names.
 *
 * Both tables share one 40-byte slot layout. They grow by doubling above 3/4 load and halve
 * (or more) below 1/8, so after growth they are >= 3/8 full and after shrinking <= 1/2 full:
 * no resize ping-pong, and memory follows the entries. A store that would need more memory
 * than the allocator gives is skipped and counted with the cap's skips: to the operator both
 * mean "the index could not take it". Slot ids are 32-bit with NIL reserved, which limits a
 * table to 2^31 slots (86 GB), beyond any sensible cap. */
#include "index/kv_index.h"

#include <stdlib.h>
#include <string.h>
#include "util/xxh.h"

#define NIL UINT32_MAX
#define MIN_SLOTS 64u
#define MAX_SLOTS ((size_t)1 << 31)
#define ENG 0 /* table kind, also the index of its list in wrec */
#define KEY 1

typedef struct slot {
    uint64_t id;                 /* ENG: engine hash; KEY: router key */
    uint64_t val;                /* ENG: router key; KEY: speculative expiry ms, 0 = real */
    uint32_t wk;                 /* worker id + 1; 0 = empty slot */
    uint32_t n[KVR_KV_NMEDIA];   /* ENG: copies per tier; KEY: engine slots with copies */
    uint32_t prev, next;         /* ENG: worker's entries; KEY: worker's speculative keys */
} slot;
_Static_assert(sizeof(slot) == 40, "the memory estimates in the docs assume 40-byte slots");

typedef struct table {
    slot *s;
    size_t cap;                  /* power of two, or 0 before the first insert */
    size_t used;
    int kind;
} table;

typedef struct wrec {
    size_t blocks[KVR_KV_NMEDIA];
    size_t entries;
    size_t spec;
    uint32_t head[2], tail[2];   /* [ENG] engine list, [KEY] speculative list by expiry */
    uint32_t block_size;
} wrec;

struct kvr_kv_index {
    table eng, key;
    wrec *w;                     /* indexed by worker id; records are never freed, only reset */
    size_t nw;
    size_t cap;
    size_t total;                /* eng.used + nspec: what the cap limits */
    size_t nspec;
    size_t sweep_at;             /* worker the next sweep starts at, so all get their turn */
    uint64_t sk_parent, sk_cap, sk_tokens;
};

/* Engine hashes from simulators or old vLLM (Python hash() of small tuples) can be small or
 * patterned; linear probing needs every bit mixed into the slot index. */
static inline size_t home(const table *t, uint32_t wk, uint64_t id)
{
    uint64_t h = id ^ ((uint64_t)wk * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (size_t)h & (t->cap - 1);
}

static uint32_t find(const table *t, uint32_t wk, uint64_t id)
{
    if (!t->cap)
        return NIL;
    for (size_t i = home(t, wk, id);; i = (i + 1) & (t->cap - 1)) {
        const slot *s = &t->s[i];
        if (!s->wk)
            return NIL;
        if (s->wk == wk && s->id == id)
            return (uint32_t)i;
    }
}

/* Caller has made room (ensure_room) and knows the id is absent. */
static uint32_t place(table *t, uint32_t wk, uint64_t id)
{
    size_t i = home(t, wk, id);
    while (t->s[i].wk)
        i = (i + 1) & (t->cap - 1);
    t->used++;
    t->s[i] = (slot){.id = id, .wk = wk, .prev = NIL, .next = NIL};
    return (uint32_t)i;
}

/* Engine slots are always on their worker's list; key slots only while speculative. */
static inline int linked(const table *t, const slot *s) { return t->kind == ENG || s->val; }

static void unlink_slot(kvr_kv_index *ix, table *t, uint32_t i)
{
    slot *s = &t->s[i];
    wrec *r = &ix->w[s->wk - 1];
    if (s->prev != NIL)
        t->s[s->prev].next = s->next;
    else
        r->head[t->kind] = s->next;
    if (s->next != NIL)
        t->s[s->next].prev = s->prev;
    else
        r->tail[t->kind] = s->prev;
}

/* Inserts slot i after slot j of its worker's list (j == NIL: at the head). */
static void link_after(kvr_kv_index *ix, table *t, uint32_t i, uint32_t j)
{
    slot *s = &t->s[i];
    wrec *r = &ix->w[s->wk - 1];
    s->prev = j;
    s->next = j == NIL ? r->head[t->kind] : t->s[j].next;
    if (s->next != NIL)
        t->s[s->next].prev = i;
    else
        r->tail[t->kind] = i;
    if (j != NIL)
        t->s[j].next = i;
    else
        r->head[t->kind] = i;
}

/* Speculative lists stay sorted by expiry; callers pass now + a fixed TTL, so the new key
 * almost always goes at the tail and the walk is O(1). */
static void link_by_expiry(kvr_kv_index *ix, uint32_t i)
{
    table *t = &ix->key;
    uint32_t j = ix->w[t->s[i].wk - 1].tail[KEY];
    while (j != NIL && t->s[j].val > t->s[i].val)
        j = t->s[j].prev;
    link_after(ix, t, i, j);
}

/* A slot moved to i: its neighbours (or the list ends) still name its old place. */
static void relink(kvr_kv_index *ix, table *t, uint32_t i)
{
    slot *s = &t->s[i];
    wrec *r = &ix->w[s->wk - 1];
    if (s->prev != NIL)
        t->s[s->prev].next = i;
    else
        r->head[t->kind] = i;
    if (s->next != NIL)
        t->s[s->next].prev = i;
    else
        r->tail[t->kind] = i;
}

/* Backward-shift deletion: later slots of the probe run move up when their home allows it,
 * so lookups never need tombstones. Moved slots fix their list neighbours. */
static void del(kvr_kv_index *ix, table *t, uint32_t i)
{
    if (linked(t, &t->s[i]))
        unlink_slot(ix, t, i);
    size_t m = t->cap - 1;
    for (size_t j = (i + 1) & m; t->s[j].wk; j = (j + 1) & m) {
        size_t h = home(t, t->s[j].wk, t->s[j].id);
        if (((j - h) & m) >= ((j - i) & m)) {
            t->s[i] = t->s[j];
            if (linked(t, &t->s[i]))
                relink(ix, t, i);
            i = (uint32_t)j;
        }
    }
    t->s[i].wk = 0;
    t->used--;
}

static void move_in(kvr_kv_index *ix, table *t, const slot *o, int sorted)
{
    uint32_t i = place(t, o->wk, o->id);
    slot *s = &t->s[i];
    s->val = o->val;
    memcpy(s->n, o->n, sizeof(s->n));
    if (t->kind == ENG || sorted)
        link_after(ix, t, i, ix->w[o->wk - 1].tail[t->kind]);
}

/* Rebuilds the table at ncap slots, rebuilding the lists (speculative ones walked in order so
 * they stay sorted). On allocation failure the table is left as it was. */
static int resize(kvr_kv_index *ix, table *t, size_t ncap)
{
    slot *ns = calloc(ncap, sizeof(*ns));
    if (!ns)
        return -1;
    table old = *t;
    t->s = ns;
    t->cap = ncap;
    t->used = 0;
    for (size_t w = 0; w < ix->nw; w++) {
        wrec *r = &ix->w[w];
        uint32_t j = r->head[t->kind];
        r->head[t->kind] = r->tail[t->kind] = NIL;
        for (; t->kind == KEY && j != NIL; j = old.s[j].next)
            move_in(ix, t, &old.s[j], 1);
    }
    for (size_t i = 0; i < old.cap; i++)
        if (old.s[i].wk && (t->kind == ENG || !old.s[i].val))
            move_in(ix, t, &old.s[i], 0);
    free(old.s);
    return 0;
}

static int ensure_room(kvr_kv_index *ix, table *t)
{
    if ((t->used + 1) * 4 <= t->cap * 3)
        return 0;
    size_t ncap = t->cap ? t->cap * 2 : MIN_SLOTS;
    return ncap > MAX_SLOTS ? -1 : resize(ix, t, ncap);
}

/* Shrinking is best effort: if the smaller array cannot be had, the big one still works. */
static void maybe_shrink(kvr_kv_index *ix, table *t)
{
    if (t->cap <= MIN_SLOTS || t->used * 8 >= t->cap)
        return;
    size_t ncap = MIN_SLOTS;
    while (ncap < t->used * 2)
        ncap *= 2;
    (void)resize(ix, t, ncap);
}

static wrec *rec_get(const kvr_kv_index *ix, size_t w) { return w < ix->nw ? &ix->w[w] : NULL; }

static wrec *rec_make(kvr_kv_index *ix, size_t w)
{
    if (w >= KVR_KV_INDEX_MAX_WORKER_ID)
        return NULL;
    if (w < ix->nw)
        return &ix->w[w];
    size_t n = ix->nw ? ix->nw : 8;
    while (n <= w)
        n *= 2;
    wrec *nr = realloc(ix->w, n * sizeof(*nr));
    if (!nr)
        return NULL;
    for (size_t i = ix->nw; i < n; i++)
        nr[i] = (wrec){.head = {NIL, NIL}, .tail = {NIL, NIL}};
    ix->w = nr;
    ix->nw = n;
    return &nr[w];
}

/* One engine slot of the worker started (+1) or stopped (-1) holding copies of key slot k in
 * tier t. Returns 1 when the worker no longer holds the key in that tier. */
static int key_tier(kvr_kv_index *ix, wrec *r, uint32_t k, int t, int up)
{
    if (k == NIL)
        return 0; /* cannot happen while the invariant holds; never crash over it */
    slot *s = &ix->key.s[k];
    if (up) {
        if (s->n[t]++ == 0)
            r->blocks[t]++;
        return 0;
    }
    if (!s->n[t] || --s->n[t])
        return 0;
    r->blocks[t]--;
    if (!s->n[!t] && !s->val)
        del(ix, &ix->key, k);
    return 1;
}

static void drop_engine(kvr_kv_index *ix, wrec *r, uint32_t e)
{
    slot o = ix->eng.s[e];
    for (int t = 0; t < KVR_KV_NMEDIA; t++)
        if (o.n[t])
            key_tier(ix, r, find(&ix->key, o.wk, o.val), t, 0);
    del(ix, &ix->eng, e);
    r->entries--;
    ix->total--;
}

/* Records one copy of engine hash `hash` naming `key` in tier t. Returns 1 when recorded. */
static size_t add_copy(kvr_kv_index *ix, wrec *r, uint32_t wk, uint64_t hash, uint64_t key,
                       int t)
{
    uint32_t e = find(&ix->eng, wk, hash);
    if (e != NIL && ix->eng.s[e].val != key) {
        /* The engine reused a hash for other tokens: the old mapping is stale, forget it. */
        drop_engine(ix, r, e);
        e = NIL;
    }
    if (e != NIL) {
        slot *s = &ix->eng.s[e];
        if (s->n[t] == UINT32_MAX)
            return 1; /* a count this high is an engine bug; saturate rather than wrap */
        if (s->n[t]++ == 0)
            key_tier(ix, r, find(&ix->key, wk, key), t, 1);
        return 1;
    }
    uint32_t k = find(&ix->key, wk, key);
    /* Settling a speculative key trades one capped entry for another, so it fits at the cap. */
    int settles = k != NIL && ix->key.s[k].val;
    if ((ix->total >= ix->cap && !settles) || ensure_room(ix, &ix->eng) ||
        (k == NIL && ensure_room(ix, &ix->key))) {
        ix->sk_cap++;
        return 0;
    }
    e = place(&ix->eng, wk, hash);
    ix->eng.s[e].val = key;
    ix->eng.s[e].n[t] = 1;
    link_after(ix, &ix->eng, e, NIL);
    r->entries++;
    ix->total++;
    k = find(&ix->key, wk, key); /* ensure_room may have moved it */
    if (k == NIL) {
        k = place(&ix->key, wk, key);
    } else if (ix->key.s[k].val) {
        unlink_slot(ix, &ix->key, k);
        ix->key.s[k].val = 0;
        r->spec--;
        ix->nspec--;
        ix->total--;
    }
    key_tier(ix, r, k, t, 1);
    return 1;
}

kvr_kv_index *kvr_kv_index_create(size_t max_blocks)
{
    if (!max_blocks)
        return NULL;
    kvr_kv_index *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return NULL;
    ix->eng.kind = ENG;
    ix->key.kind = KEY;
    ix->cap = max_blocks;
    return ix;
}

void kvr_kv_index_destroy(kvr_kv_index *ix)
{
    if (!ix)
        return;
    free(ix->eng.s);
    free(ix->key.s);
    free(ix->w);
    free(ix);
}

void kvr_kv_index_set_max_blocks(kvr_kv_index *ix, size_t max_blocks)
{
    ix->cap = max_blocks ? max_blocks : 1;
}

size_t kvr_kv_index_stored(kvr_kv_index *ix, size_t worker, const uint64_t *hashes, size_t n,
                           int has_parent, uint64_t parent, const uint32_t *tokens,
                           size_t ntokens, uint32_t block_size, kvr_kv_medium medium)
{
    if (!n || !hashes)
        return 0;
    int t = medium == KVR_KV_GPU ? KVR_KV_GPU : KVR_KV_CPU;
    wrec *r = rec_make(ix, worker);
    if (!r) {
        ix->sk_cap += n;
        return 0;
    }
    if (block_size && r->block_size != block_size) {
        if (r->block_size)
            kvr_kv_index_clear_worker(ix, worker);
        r->block_size = block_size;
    }
    uint32_t wk = (uint32_t)worker + 1;
    size_t done = 0;
    if (!ntokens) {
        /* A re-announce names blocks already placed in the chain, so the parent is moot. */
        for (size_t i = 0; i < n; i++) {
            uint32_t e = find(&ix->eng, wk, hashes[i]);
            if (e == NIL)
                ix->sk_parent++;
            else
                done += add_copy(ix, r, wk, hashes[i], ix->eng.s[e].val, t);
        }
        return done;
    }
    size_t bs = r->block_size;
    if (!bs || !tokens || ntokens % bs || ntokens / bs != n) {
        ix->sk_tokens += n;
        return 0;
    }
    uint64_t seed = 0;
    if (has_parent) {
        uint32_t e = find(&ix->eng, wk, parent);
        if (e == NIL) {
            ix->sk_parent += n;
            return 0;
        }
        seed = ix->eng.s[e].val;
    }
    /* Keys hash the token ids' host memory: little-endian bytes on every platform kvroute
     * runs on. Events and requests are both keyed here, so only cross-host comparison of keys
     * (none today) would depend on it. */
    for (size_t i = 0; i < n; i++) {
        seed = XXH3_64bits_withSeed(tokens + i * bs, bs * sizeof(uint32_t), seed);
        done += add_copy(ix, r, wk, hashes[i], seed, t);
    }
    return done;
}

size_t kvr_kv_index_removed(kvr_kv_index *ix, size_t worker, const uint64_t *hashes, size_t n,
                            kvr_kv_medium medium)
{
    wrec *r = rec_get(ix, worker);
    if (!r || !r->entries || !hashes)
        return 0;
    int t = medium == KVR_KV_GPU ? KVR_KV_GPU : KVR_KV_CPU;
    uint32_t wk = (uint32_t)worker + 1;
    size_t gone = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = find(&ix->eng, wk, hashes[i]);
        if (e == NIL || !ix->eng.s[e].n[t])
            continue;
        slot *s = &ix->eng.s[e];
        if (--s->n[t])
            continue;
        gone += (size_t)key_tier(ix, r, find(&ix->key, wk, s->val), t, 0);
        if (!s->n[!t]) {
            del(ix, &ix->eng, e);
            r->entries--;
            ix->total--;
        }
    }
    maybe_shrink(ix, &ix->eng);
    maybe_shrink(ix, &ix->key);
    return gone;
}

size_t kvr_kv_index_clear_worker(kvr_kv_index *ix, size_t worker)
{
    wrec *r = rec_get(ix, worker);
    if (!r)
        return 0;
    size_t dropped = r->entries + r->spec;
    /* Every real key slot is named by one of the worker's engine slots; speculative ones are
     * on the speculative list. Shared keys are found once, then are already gone. */
    while (r->head[ENG] != NIL) {
        uint32_t e = r->head[ENG];
        uint32_t k = find(&ix->key, ix->eng.s[e].wk, ix->eng.s[e].val);
        if (k != NIL)
            del(ix, &ix->key, k);
        del(ix, &ix->eng, e);
    }
    while (r->head[KEY] != NIL)
        del(ix, &ix->key, r->head[KEY]);
    ix->total -= dropped;
    ix->nspec -= r->spec;
    *r = (wrec){.head = {NIL, NIL}, .tail = {NIL, NIL}};
    maybe_shrink(ix, &ix->eng);
    maybe_shrink(ix, &ix->key);
    return dropped;
}

size_t kvr_kv_index_keys(const uint32_t *tokens, size_t n, uint32_t block_size,
                         uint64_t *keys, size_t max)
{
    if (!block_size)
        return 0;
    size_t nb = n / block_size;
    uint64_t seed = 0;
    for (size_t i = 0; i < nb && i < max; i++) {
        seed = XXH3_64bits_withSeed(tokens + i * block_size,
                                    (size_t)block_size * sizeof(uint32_t), seed);
        keys[i] = seed;
    }
    return nb;
}

size_t kvr_kv_index_match(const kvr_kv_index *ix, size_t worker, const uint64_t *keys,
                          size_t nkeys, uint64_t now_ms, size_t *gpu_run)
{
    const wrec *r = rec_get(ix, worker);
    size_t run = 0, grun = 0;
    int gpu = 1;
    if (r && (r->blocks[KVR_KV_GPU] || r->blocks[KVR_KV_CPU] || r->spec)) {
        uint32_t wk = (uint32_t)worker + 1;
        for (; run < nkeys; run++) {
            uint32_t k = find(&ix->key, wk, keys[run]);
            if (k == NIL)
                break;
            const slot *s = &ix->key.s[k];
            int live = s->val && now_ms < s->val;
            if (!live && !s->n[KVR_KV_GPU] && !s->n[KVR_KV_CPU])
                break;
            gpu = gpu && (live || s->n[KVR_KV_GPU]);
            grun += (size_t)gpu;
        }
    }
    if (gpu_run)
        *gpu_run = grun;
    return run;
}

size_t kvr_kv_index_speculate(kvr_kv_index *ix, size_t worker, const uint64_t *keys, size_t n,
                              uint64_t expires_ms)
{
    if (!expires_ms || !n)
        return 0; /* 0 is the "real entry" mark, and could never be live anyway */
    wrec *r = rec_make(ix, worker);
    if (!r)
        return 0;
    uint32_t wk = (uint32_t)worker + 1;
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = find(&ix->key, wk, keys[i]);
        if (k != NIL) {
            slot *s = &ix->key.s[k];
            if (!s->val)
                continue;
            if (expires_ms > s->val) {
                unlink_slot(ix, &ix->key, k);
                s->val = expires_ms;
                link_by_expiry(ix, k);
            }
            done++;
            continue;
        }
        /* Guesses may take a quarter of the cap at most: the rest stays for what the events
         * say (a client sending its own token ids must not crowd those out). */
        if (ix->total >= ix->cap || ix->nspec >= ix->cap / 4 || ensure_room(ix, &ix->key))
            continue;
        k = place(&ix->key, wk, keys[i]);
        ix->key.s[k].val = expires_ms;
        link_by_expiry(ix, k);
        r->spec++;
        ix->nspec++;
        ix->total++;
        done++;
    }
    return done;
}

size_t kvr_kv_index_sweep(kvr_kv_index *ix, uint64_t now_ms, size_t max)
{
    size_t dropped = 0;
    for (size_t c = 0; c < ix->nw && ix->nspec && dropped < max; c++) {
        size_t w = (ix->sweep_at + c) % ix->nw;
        wrec *r = &ix->w[w];
        while (dropped < max && r->head[KEY] != NIL && ix->key.s[r->head[KEY]].val <= now_ms) {
            del(ix, &ix->key, r->head[KEY]);
            r->spec--;
            dropped++;
        }
        if (dropped == max)
            ix->sweep_at = w; /* it may have more: it goes first next time */
    }
    ix->nspec -= dropped;
    ix->total -= dropped;
    if (dropped)
        maybe_shrink(ix, &ix->key);
    return dropped;
}

uint32_t kvr_kv_index_block_size(const kvr_kv_index *ix, size_t worker)
{
    const wrec *r = rec_get(ix, worker);
    return r ? r->block_size : 0;
}

void kvr_kv_index_worker_stats(const kvr_kv_index *ix, size_t worker, kvr_kv_worker_stats *out)
{
    const wrec *r = rec_get(ix, worker);
    memset(out, 0, sizeof(*out));
    if (!r)
        return;
    for (int t = 0; t < KVR_KV_NMEDIA; t++)
        out->blocks[t] = r->blocks[t];
    out->entries = r->entries;
    out->speculative = r->spec;
    out->block_size = r->block_size;
}

void kvr_kv_index_stats_get(const kvr_kv_index *ix, kvr_kv_index_stats *out)
{
    out->entries = ix->total;
    out->skipped_unknown_parent = ix->sk_parent;
    out->skipped_cap = ix->sk_cap;
    out->skipped_bad_tokens = ix->sk_tokens;
    out->memory_bytes = sizeof(*ix) + (ix->eng.cap + ix->key.cap) * sizeof(slot) +
                        ix->nw * sizeof(wrec);
}
