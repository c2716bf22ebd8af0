/* Prefix block index: an open-addressed table of (key, worker) holdings with per-worker
 * intrusive LRU lists. See prefix_index.h for the contract.
 *
 * Layout. A slot is 16 bytes: `kw` = 48-bit key fingerprint << 16 | 16-bit internal worker
 * index (0 = empty; the fingerprint is never 0), and the worker's LRU links as 32-bit slot
 * indexes. Slots are grouped in buckets of 8 (two cache lines). A key's home bucket comes from
 * its fingerprint; an entry that does not fit there goes to the next bucket with a free slot,
 * and every bucket it passes over counts it in `ovf` (F14's "outbound overflow" count). A
 * lookup scans buckets from the home while their count is non-zero, so all holders of a key are
 * found in one short scan and a miss usually costs one bucket. Entries never move except when
 * the table grows, so the LRU links can be plain slot indexes (no back-pointer fix-ups on insert
 * or delete, no tombstones).
 *
 * Why 48-bit fingerprints: the home is derived from the fingerprint, so two keys are confused
 * only if 48 bits collide among the few entries scanned (~2^-46 per lookup); the other 16 bits
 * of the word name the worker, which keeps a holding at 16 bytes (the 0.3 bytes per text byte
 * budget is ~19 bytes per 64-byte block). A confusion only makes a match one block longer. */
#include "index/prefix_index.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "util/rand.h"

#define NIL UINT32_MAX
#define BUCKET 8                 /* slots per bucket */
#define LOAD_GROW_NUM 9          /* grow when holdings exceed 9/10 of the slots */
#define LOAD_GROW_DEN 10
#define LOAD_HARD_NUM 97         /* never exceed 97/100: evict when growth failed */
#define LOAD_HARD_DEN 100
#define INITIAL_BUCKETS 64       /* 512 slots, 8 KiB: a model with little traffic stays small */
#define MAX_BUCKETS (((size_t)UINT32_MAX - 1) / BUCKET)
#define SEED0 0x6b76726f75746531ull /* seed of block 0's key; any fixed value works */
#define MATCH_BATCH 16           /* blocks hashed ahead of their probes, to prefetch buckets */

typedef struct slot {
    uint64_t kw;                 /* fp << 16 | worker; 0 = empty */
    uint32_t prev;               /* towards the worker's most recently used entry */
    uint32_t next;               /* towards its least recently used entry */
} slot;

typedef struct wrec {
    size_t ext;                  /* registry id */
    size_t count;                /* holdings */
    size_t cap;                  /* 0 = default */
    uint32_t head;               /* most recently used slot */
    uint32_t tail;               /* least recently used slot: the next victim */
    int used;
} wrec;

struct kvr_prefix_index {
    size_t block_bytes;
    size_t max_keys;
    size_t default_cap;
    slot *slots;
    uint8_t *ovf;                /* per bucket, saturating at 255 (then sticky: still correct,
                                    lookups just scan one bucket more until the next growth) */
    size_t nb;                   /* buckets */
    size_t used;                 /* holdings */
    size_t keys;                 /* distinct fingerprints */
    uint64_t evictions;
    uint64_t forgotten;
    wrec *w;
    size_t nw;                   /* records allocated (used or free) */
    uint32_t *ext2int;           /* registry id -> internal index + 1; 0 = none */
    size_t next_alloc;
    uint64_t *chain;             /* scratch: block keys of the text being inserted */
    size_t chain_alloc;
    uint64_t *cset;              /* scratch: open-addressed set of the chain's fingerprints */
    size_t cset_mask;
    size_t cset_alloc;
    uint32_t *want;              /* scratch for match: internal index -> request position + 1 */
};

static inline uint64_t fp_of(uint64_t key)
{
    uint64_t f = key >> 16;
    return f ? f : 1;
}

static inline size_t home_of(size_t nb, uint64_t fp)
{
    /* Lemire's range reduction on the (uniform) top bits: any bucket count works, so the table
     * can grow by 1.5x and stay near its load target. */
    return (size_t)(((unsigned __int128)(fp << 16) * nb) >> 64);
}

static inline size_t bnext(size_t nb, size_t b)
{
    return ++b == nb ? 0 : b;
}

size_t kvr_prefix_index_block_keys(size_t block_bytes, const void *text, size_t len,
                                   uint64_t *keys, size_t max)
{
    if (!block_bytes || !len)
        return 0;
    const char *p = text;
    size_t n = (len + block_bytes - 1) / block_bytes;
    uint64_t seed = SEED0;
    for (size_t i = 0; i < n && i < max; i++) {
        size_t off = i * block_bytes, bl = len - off < block_bytes ? len - off : block_bytes;
        seed = XXH3_64bits_withSeed(p + off, bl, seed);
        keys[i] = seed;
    }
    return n;
}

size_t kvr_prefix_index_blocks_for_kv_tokens(int64_t kv_tokens, size_t block_bytes)
{
    if (kv_tokens <= 0 || !block_bytes)
        return 0;
    unsigned __int128 bytes = (unsigned __int128)kv_tokens * KVR_PREFIX_INDEX_BYTES_PER_TOKEN;
    unsigned __int128 b = bytes / block_bytes;
    if (b > SIZE_MAX)
        return SIZE_MAX;
    return b ? (size_t)b : 1;
}

kvr_prefix_index *kvr_prefix_index_create(const kvr_prefix_index_cfg *cfg)
{
    if (!cfg || !cfg->block_bytes || !cfg->max_blocks)
        return NULL;
    kvr_prefix_index *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return NULL;
    ix->block_bytes = cfg->block_bytes;
    ix->max_keys = cfg->max_blocks;
    ix->default_cap = cfg->worker_blocks ? cfg->worker_blocks : cfg->max_blocks;
    ix->nb = INITIAL_BUCKETS;
    ix->slots = calloc(ix->nb * BUCKET, sizeof(slot));
    ix->ovf = calloc(ix->nb, 1);
    if (!ix->slots || !ix->ovf) {
        kvr_prefix_index_destroy(ix);
        return NULL;
    }
    return ix;
}

void kvr_prefix_index_destroy(kvr_prefix_index *ix)
{
    if (!ix)
        return;
    free(ix->slots);
    free(ix->ovf);
    free(ix->w);
    free(ix->ext2int);
    free(ix->chain);
    free(ix->cset);
    free(ix->want);
    free(ix);
}

/* ---- table primitives ---------------------------------------------------------------- */

/* Stores (fp, wi) in the first free slot from fp's home (the caller guarantees one exists and
 * that the pair is absent) and counts the overflow of every bucket passed over. */
static uint32_t table_place(slot *slots, uint8_t *ovf, size_t nb, uint64_t fp, uint32_t wi)
{
    size_t h = home_of(nb, fp), b = h;
    for (;;) {
        slot *bk = slots + b * BUCKET;
        for (int j = 0; j < BUCKET; j++) {
            if (bk[j].kw == 0) {
                for (size_t x = h; x != b; x = bnext(nb, x))
                    if (ovf[x] != 255)
                        ovf[x]++;
                bk[j].kw = fp << 16 | wi;
                bk[j].prev = bk[j].next = NIL;
                return (uint32_t)(b * BUCKET + j);
            }
        }
        b = bnext(nb, b);
    }
}

/* Finds the slot of (fp, wi); NIL if absent. `*shared` = another worker holds fp. */
static uint32_t table_find(const kvr_prefix_index *ix, uint64_t fp, uint32_t wi, int *shared)
{
    size_t b = home_of(ix->nb, fp);
    uint32_t found = NIL;
    *shared = 0;
    for (;;) {
        const slot *bk = ix->slots + b * BUCKET;
        for (int j = 0; j < BUCKET; j++) {
            uint64_t kw = bk[j].kw;
            if (kw && (kw >> 16) == fp) {
                if ((kw & 0xffff) == wi)
                    found = (uint32_t)(b * BUCKET + j);
                else
                    *shared = 1;
            }
        }
        if (ix->ovf[b] == 0)
            return found;
        b = bnext(ix->nb, b);
    }
}

static int fp_present(const kvr_prefix_index *ix, uint64_t fp)
{
    int shared;
    /* Worker index 0xffff never exists (at most 65535 records, 0..65534), so any holder of fp
     * shows up as "shared". */
    table_find(ix, fp, 0xffff, &shared);
    return shared;
}

static void table_remove(kvr_prefix_index *ix, uint32_t s)
{
    uint64_t fp = ix->slots[s].kw >> 16;
    size_t h = home_of(ix->nb, fp), e = s / BUCKET;
    for (size_t x = h; x != e; x = bnext(ix->nb, x))
        if (ix->ovf[x] != 255)
            ix->ovf[x]--;
    ix->slots[s].kw = 0;
    ix->used--;
}

/* ---- per-worker LRU ------------------------------------------------------------------- */

static void lru_unlink(kvr_prefix_index *ix, wrec *w, uint32_t s)
{
    slot *x = &ix->slots[s];
    if (x->prev != NIL)
        ix->slots[x->prev].next = x->next;
    else
        w->head = x->next;
    if (x->next != NIL)
        ix->slots[x->next].prev = x->prev;
    else
        w->tail = x->prev;
}

static void lru_push_head(kvr_prefix_index *ix, wrec *w, uint32_t s)
{
    slot *x = &ix->slots[s];
    x->prev = NIL;
    x->next = w->head;
    if (w->head != NIL)
        ix->slots[w->head].prev = s;
    else
        w->tail = s;
    w->head = s;
}

/* ---- workers ------------------------------------------------------------------------- */

static size_t eff_cap(const kvr_prefix_index *ix, const wrec *w)
{
    size_t c = w && w->cap ? w->cap : ix->default_cap;
    return c < ix->max_keys ? c : ix->max_keys;
}

static long worker_find(const kvr_prefix_index *ix, size_t ext)
{
    if (ext >= ix->next_alloc || !ix->ext2int[ext])
        return -1;
    return (long)ix->ext2int[ext] - 1;
}

static long worker_get(kvr_prefix_index *ix, size_t ext)
{
    long wi = worker_find(ix, ext);
    if (wi >= 0)
        return wi;
    if (ext >= KVR_PREFIX_INDEX_MAX_WORKER_ID)
        return -1;
    if (ext >= ix->next_alloc) {
        size_t n = ix->next_alloc ? ix->next_alloc : 16;
        while (n <= ext)
            n *= 2;
        uint32_t *p = realloc(ix->ext2int, n * sizeof(*p));
        if (!p)
            return -1;
        memset(p + ix->next_alloc, 0, (n - ix->next_alloc) * sizeof(*p));
        ix->ext2int = p;
        ix->next_alloc = n;
    }
    size_t i;
    for (i = 0; i < ix->nw; i++)
        if (!ix->w[i].used)
            break;
    if (i == ix->nw) {
        if (ix->nw >= KVR_PREFIX_INDEX_MAX_WORKERS)
            return -1;
        wrec *nw = realloc(ix->w, (ix->nw + 1) * sizeof(*nw));
        uint32_t *want = realloc(ix->want, (ix->nw + 1) * sizeof(*want));
        if (nw)
            ix->w = nw;
        if (want)
            ix->want = want;
        if (!nw || !want)
            return -1;
        ix->want[ix->nw] = 0;
        ix->nw++;
    }
    wrec *w = &ix->w[i];
    memset(w, 0, sizeof(*w));
    w->ext = ext;
    w->head = w->tail = NIL;
    w->used = 1;
    ix->ext2int[ext] = (uint32_t)i + 1;
    return (long)i;
}

/* ---- eviction and growth -------------------------------------------------------------- */

static void evict_one(kvr_prefix_index *ix, uint32_t wi)
{
    wrec *w = &ix->w[wi];
    uint32_t s = w->tail;
    uint64_t fp = ix->slots[s].kw >> 16;
    lru_unlink(ix, w, s);
    w->count--;
    table_remove(ix, s);
    if (!fp_present(ix, fp))
        ix->keys--;
    ix->evictions++;
}

/* The worker holding the most blocks (ties at random) and the runner-up's count. Under the
 * global cap, the biggest holder gives up its least recently used block: no per-entry clock
 * is needed and no worker can starve the others of index space. */
static long largest_worker(const kvr_prefix_index *ix, size_t *second)
{
    long best = -1;
    size_t bc = 0, sc = 0;
    uint64_t ties = 0;
    for (size_t i = 0; i < ix->nw; i++) {
        const wrec *w = &ix->w[i];
        if (!w->used || !w->count)
            continue;
        if (best < 0 || w->count > bc) {
            sc = bc;
            best = (long)i;
            bc = w->count;
            ties = 1;
        } else if (w->count == bc) {
            sc = bc;
            if (kvr_rand_below(++ties) == 0)
                best = (long)i;
        } else if (w->count > sc) {
            sc = w->count;
        }
    }
    *second = sc;
    return best;
}

static void enforce_global_cap(kvr_prefix_index *ix)
{
    while (ix->keys > ix->max_keys) {
        size_t second;
        long wi = largest_worker(ix, &second);
        if (wi < 0)
            break;
        /* Stay on this worker while it is still at least as big as the runner-up. */
        while (ix->keys > ix->max_keys && ix->w[wi].count && ix->w[wi].count >= second)
            evict_one(ix, (uint32_t)wi);
    }
}

/* Rebuilds the table with `nb` buckets. Slot indexes change, so every LRU link and list end is
 * translated through an old -> new map. O(holdings); happens at 1.5x growth steps only. */
static int rebuild(kvr_prefix_index *ix, size_t nb)
{
    size_t old_n = ix->nb * BUCKET;
    slot *ns = calloc(nb * BUCKET, sizeof(slot));
    uint8_t *no = calloc(nb, 1);
    uint32_t *map = malloc(old_n * sizeof(uint32_t));
    if (!ns || !no || !map) {
        free(ns);
        free(no);
        free(map);
        return -1;
    }
    for (size_t s = 0; s < old_n; s++) {
        const slot *o = &ix->slots[s];
        if (!o->kw)
            continue;
        uint32_t t = table_place(ns, no, nb, o->kw >> 16, (uint32_t)(o->kw & 0xffff));
        ns[t].prev = o->prev;
        ns[t].next = o->next;
        map[s] = t;
    }
    for (size_t t = 0; t < nb * BUCKET; t++) {
        if (!ns[t].kw)
            continue;
        if (ns[t].prev != NIL)
            ns[t].prev = map[ns[t].prev];
        if (ns[t].next != NIL)
            ns[t].next = map[ns[t].next];
    }
    for (size_t i = 0; i < ix->nw; i++) {
        wrec *w = &ix->w[i];
        if (!w->used)
            continue;
        if (w->head != NIL)
            w->head = map[w->head];
        if (w->tail != NIL)
            w->tail = map[w->tail];
    }
    free(map);
    free(ix->slots);
    free(ix->ovf);
    ix->slots = ns;
    ix->ovf = no;
    ix->nb = nb;
    return 0;
}

/* Buckets that hold `holdings` at the load target. */
static size_t buckets_for(size_t holdings)
{
    unsigned __int128 slots = (unsigned __int128)holdings * LOAD_GROW_DEN / LOAD_GROW_NUM + 1;
    unsigned __int128 nb = (slots + BUCKET - 1) / BUCKET;
    return nb > MAX_BUCKETS ? MAX_BUCKETS : (size_t)nb;
}

/* Makes room for one more holding: grow past the load target; if growing is impossible, evict
 * from the biggest holder before the table gets too full to probe quickly. Growth steps are
 * 1.5x but never past what the workers' caps can ever need (holdings never exceed the sum of
 * the caps), so a full index sits near the load target: ~18 bytes per held block. */
static int ensure_room(kvr_prefix_index *ix)
{
    size_t n = ix->nb * BUCKET;
    if ((ix->used + 1) * LOAD_GROW_DEN <= n * LOAD_GROW_NUM)
        return 0;
    if (ix->nb < MAX_BUCKETS) {
        size_t bound = 0;
        for (size_t i = 0; i < ix->nw; i++)
            if (ix->w[i].used) {
                size_t c = eff_cap(ix, &ix->w[i]);
                bound = bound > SIZE_MAX - c ? SIZE_MAX : bound + c;
            }
        size_t nb = ix->nb + ix->nb / 2, need = buckets_for(bound);
        if (nb > need && need > ix->nb)
            nb = need;
        if (nb > MAX_BUCKETS)
            nb = MAX_BUCKETS;
        if (nb > ix->nb && rebuild(ix, nb) == 0)
            return 0;
    }
    while ((ix->used + 1) * LOAD_HARD_DEN > n * LOAD_HARD_NUM) {
        size_t second;
        long wi = largest_worker(ix, &second);
        if (wi < 0)
            return -1;
        evict_one(ix, (uint32_t)wi);
    }
    return 0;
}

/* ---- public operations ---------------------------------------------------------------- */

static int grow_chain(kvr_prefix_index *ix, size_t n)
{
    if (n <= ix->chain_alloc)
        return 0;
    size_t a = ix->chain_alloc ? ix->chain_alloc : 64;
    while (a < n)
        a *= 2;
    uint64_t *p = realloc(ix->chain, a * sizeof(*p));
    if (!p)
        return -1;
    ix->chain = p;
    ix->chain_alloc = a;
    return 0;
}

/* The set of fingerprints of ix->chain[0..m), for the eviction rule in insert. */
static int cset_build(kvr_prefix_index *ix, size_t m)
{
    size_t need = 16;
    while (need < 2 * m)
        need *= 2;
    if (need > ix->cset_alloc) {
        uint64_t *p = realloc(ix->cset, need * sizeof(*p));
        if (!p)
            return -1;
        ix->cset = p;
        ix->cset_alloc = need;
    }
    memset(ix->cset, 0, need * sizeof(*ix->cset));
    ix->cset_mask = need - 1;
    for (size_t i = 0; i < m; i++) {
        uint64_t fp = fp_of(ix->chain[i]);
        size_t h = (size_t)(fp * 0x9e3779b97f4a7c15ull >> 20) & ix->cset_mask;
        while (ix->cset[h] && ix->cset[h] != fp)
            h = (h + 1) & ix->cset_mask;
        ix->cset[h] = fp;
    }
    return 0;
}

static int cset_has(const kvr_prefix_index *ix, uint64_t fp)
{
    size_t h = (size_t)(fp * 0x9e3779b97f4a7c15ull >> 20) & ix->cset_mask;
    while (ix->cset[h]) {
        if (ix->cset[h] == fp)
            return 1;
        h = (h + 1) & ix->cset_mask;
    }
    return 0;
}

int kvr_prefix_index_insert(kvr_prefix_index *ix, size_t worker, const void *text, size_t len)
{
    if (!len)
        return 0;
    long wl = worker_get(ix, worker);
    if (wl < 0)
        return -1;
    uint32_t wi = (uint32_t)wl;
    size_t B = ix->block_bytes, nblocks = (len + B - 1) / B;
    size_t cap = eff_cap(ix, &ix->w[wi]);
    /* Blocks past the cap would be evicted again at once (they are the least recent). */
    size_t m = nblocks < cap ? nblocks : cap;
    if (grow_chain(ix, m) < 0)
        return -1;
    kvr_prefix_index_block_keys(B, text, len, ix->chain, m);

    int rc = 0, have_set = 0;
    for (size_t k = m; k-- > 0;) {
        if (k >= 8)
            __builtin_prefetch(ix->slots + home_of(ix->nb, fp_of(ix->chain[k - 8])) * BUCKET);
        if (ensure_room(ix) < 0) {
            rc = -1;
            break;
        }
        uint64_t fp = fp_of(ix->chain[k]);
        int shared;
        wrec *w = &ix->w[wi];
        uint32_t s = table_find(ix, fp, wi, &shared);
        if (s == NIL) {
            /* Make room in the worker's budget first, so holdings never exceed the caps (the
             * table is sized for them). The victim is the least recent block not in this text:
             * one of this text's blocks still waiting to be touched is touched now instead
             * (the loop touches it again in order), never evicted and re-added. Since m <= cap,
             * the worker always holds some block outside the text here. */
            while (w->count >= cap) {
                if (!have_set) {
                    if (cset_build(ix, m) < 0) {
                        rc = -1;
                        goto out;
                    }
                    have_set = 1;
                }
                uint32_t t = w->tail;
                if (cset_has(ix, ix->slots[t].kw >> 16)) {
                    lru_unlink(ix, w, t);
                    lru_push_head(ix, w, t);
                } else {
                    evict_one(ix, wi);
                }
            }
            s = table_place(ix->slots, ix->ovf, ix->nb, fp, wi);
            ix->used++;
            w->count++;
            if (!shared) /* still true: the evictions above only took this worker's blocks */
                ix->keys++;
        } else {
            lru_unlink(ix, w, s);
        }
        lru_push_head(ix, w, s);
    }
out:
    while (ix->w[wi].count > cap)
        evict_one(ix, wi);
    enforce_global_cap(ix);
    return rc;
}

void kvr_prefix_index_match(kvr_prefix_index *ix, const void *text, size_t len,
                            const size_t *workers, size_t n, size_t *matched)
{
    memset(matched, 0, n * sizeof(*matched));
    if (!len || !n || !ix->used)
        return;
    size_t known = 0;
    for (size_t j = 0; j < n; j++) {
        long wi = worker_find(ix, workers[j]);
        if (wi >= 0 && ix->w[wi].count) {
            ix->want[wi] = (uint32_t)j + 1;
            known++;
        }
    }
    if (!known)
        return;

    const char *p = text;
    size_t B = ix->block_bytes, nblocks = (len + B - 1) / B, nb = ix->nb;
    const slot *slots = ix->slots;
    const uint8_t *ovf = ix->ovf;
    const uint32_t *want = ix->want;
    uint64_t seed = SEED0;
    uint64_t fps[MATCH_BATCH];
    size_t homes[MATCH_BATCH];
    /* Hash a batch of blocks ahead (the chain is sequential but cheap) and prefetch their
     * buckets, so the table's cache misses overlap instead of adding up. */
    for (size_t i = 0; i < nblocks; i += MATCH_BATCH) {
        size_t cnt = nblocks - i < MATCH_BATCH ? nblocks - i : MATCH_BATCH;
        for (size_t k = 0; k < cnt; k++) {
            size_t off = (i + k) * B, bl = len - off < B ? len - off : B;
            seed = XXH3_64bits_withSeed(p + off, bl, seed);
            fps[k] = fp_of(seed);
            homes[k] = home_of(nb, fps[k]);
            const char *bp = (const char *)(slots + homes[k] * BUCKET);
            __builtin_prefetch(bp);
            __builtin_prefetch(bp + 64);
        }
        for (size_t k = 0; k < cnt; k++) {
            size_t off = (i + k) * B, bl = len - off < B ? len - off : B;
            uint64_t fp = fps[k];
            size_t b = homes[k], ext = 0;
            for (;;) {
                const slot *bk = slots + b * BUCKET;
                for (int j = 0; j < BUCKET; j++) {
                    uint64_t kw = bk[j].kw;
                    if (kw && (kw >> 16) == fp) {
                        uint32_t r = want[kw & 0xffff];
                        if (r && matched[r - 1] == off) {
                            matched[r - 1] = off + bl;
                            ext++;
                        }
                    }
                }
                if (ovf[b] == 0)
                    break;
                b = bnext(nb, b);
            }
            if (!ext)
                goto done;
        }
    }
done:
    for (size_t j = 0; j < n; j++) {
        long wi = worker_find(ix, workers[j]);
        if (wi >= 0)
            ix->want[wi] = 0;
    }
}

size_t kvr_prefix_index_forget_worker(kvr_prefix_index *ix, size_t worker)
{
    long wl = worker_find(ix, worker);
    if (wl < 0)
        return 0;
    wrec *w = &ix->w[wl];
    size_t dropped = 0;
    for (uint32_t s = w->head; s != NIL;) {
        uint32_t nx = ix->slots[s].next;
        uint64_t fp = ix->slots[s].kw >> 16;
        table_remove(ix, s);
        if (!fp_present(ix, fp))
            ix->keys--;
        dropped++;
        s = nx;
    }
    ix->forgotten += dropped;
    w->used = 0;
    w->count = 0;
    w->head = w->tail = NIL;
    ix->ext2int[worker] = 0;
    return dropped;
}

int kvr_prefix_index_set_worker_capacity(kvr_prefix_index *ix, size_t worker, size_t blocks)
{
    long wl = worker_get(ix, worker);
    if (wl < 0)
        return -1;
    ix->w[wl].cap = blocks;
    size_t cap = eff_cap(ix, &ix->w[wl]);
    while (ix->w[wl].count > cap)
        evict_one(ix, (uint32_t)wl);
    return 0;
}

size_t kvr_prefix_index_worker_blocks(const kvr_prefix_index *ix, size_t worker)
{
    long wl = worker_find(ix, worker);
    return wl < 0 ? 0 : ix->w[wl].count;
}

size_t kvr_prefix_index_worker_capacity(const kvr_prefix_index *ix, size_t worker)
{
    long wl = worker_find(ix, worker);
    return eff_cap(ix, wl < 0 ? NULL : &ix->w[wl]);
}

void kvr_prefix_index_stats_get(const kvr_prefix_index *ix, kvr_prefix_index_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->blocks = ix->keys;
    out->holdings = ix->used;
    for (size_t i = 0; i < ix->nw; i++)
        out->workers += ix->w[i].used != 0;
    out->evictions = ix->evictions;
    out->forgotten = ix->forgotten;
    out->table_slots = ix->nb * BUCKET;
    out->memory_bytes = sizeof(*ix) + ix->nb * BUCKET * sizeof(slot) + ix->nb +
                        ix->nw * (sizeof(wrec) + sizeof(uint32_t)) +
                        ix->next_alloc * sizeof(uint32_t) + ix->chain_alloc * sizeof(uint64_t) +
                        ix->cset_alloc * sizeof(uint64_t);
}
