/* Prefix block index: bucketized cuckoo hash tables of (key, worker) holdings with per-worker
 * intrusive LRU lists. See prefix_index.h for the contract.
 *
 * Slot (16 bytes): `kw` = 44-bit key fingerprint | 6-bit holder group | 14-bit internal worker
 * index (0 = empty; a fingerprint is never 0), and the worker's LRU links as 32-bit slot ids.
 * Its use stamp (4 bytes) sits at the same index in a parallel array: a bucket stays one cache
 * line, and matching, which never needs stamps, reads no more memory than without them. Only
 * teaching (which writes them) and the pick's snapshot of the chosen worker's run boundaries
 * touch stamps.
 *
 * Tables: the fingerprint's top 8 bits pick one of 256 shards, each an independent table that
 * grows on its own (1.25x steps, at load thresholds staggered between 84 and 92 % so the shards
 * do not all grow at once), so a growth step rebuilds 1/256 of the index: a 10 M-block index
 * pauses a few ms per step instead of ~1 s for a whole-table rebuild, and the steps are spread
 * over many requests. A slot id is shard << 24 | index in the shard.
 *
 * In a shard, buckets of 4 slots = one 64-byte cache line. The holders of a key are kept in
 * groups of GROUP (4); group g of fingerprint f has two candidate buckets derived from (f, g),
 * and groups are dense (groups 0..G-2 full, G-1 partly), so a lookup reads group 0's pair and
 * goes on only while a group is full. A block held by one worker, the common case, costs
 * exactly two cache lines, independent of each other (both prefetched while the next blocks are
 * hashed) and of the index size; a block shared by H workers costs about H/4 pairs, lines that
 * every request with that shared prefix keeps hot. A new holding goes to the emptier candidate;
 * when both are full, a random walk moves entries to their other bucket (cuckoo hashing). With
 * 2 choices and 4-slot buckets that works up to ~97 % load, so shards run at up to 92 %: ~21.7
 * bytes per held block with its stamp. Entries move only in such walks, in group compaction and
 * in growth; a moved entry's LRU neighbours are re-pointed (no tombstones, no overflow counts).
 *
 * Why 44-bit fingerprints: buckets derive from the fingerprint (a stored entry knows its other
 * bucket), so keys are told apart by those 44 bits among the 8 slots looked at (a false match
 * ~2^-41 per probe; two stored keys merge with probability ~keys/2^44 per insert); the other 20
 * bits of the word hold the group and the worker, which keeps a slot at 16 bytes (4 to a cache
 * line). A confusion only makes a match one block longer.
 *
 * Repeats: a conversation's requests resend its text, and identical requests take turns on
 * equally good workers. Each worker keeps a hint of the slots its last insert left the chain's
 * blocks in (checked slot by slot before use), so matching and teaching its own text read
 * those slots instead of looking blocks up. When the text taught is exactly the one the worker
 * was last taught and nothing changed on that worker since (a per-worker change count, bumped
 * before anything relinks or moves one of its holdings), its blocks are still its most recent
 * holdings in order: the teach only records the new stamp for them, written out (w_settle)
 * before anything reads or moves them. */
#include "index/prefix_index.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "util/xxh.h"

#include "util/rand.h"

#define NIL UINT32_MAX
#define BUCKET 4                 /* slots per bucket: 4 × 16 B = one cache line */
#define GROUP 4                  /* holders of one key per bucket pair */
#define MAX_GROUPS 64            /* 6 bits: at most 256 holders per key */
#define W_NONE 0x3fff            /* 14-bit worker index that is never a worker */
#define KW(fp, g, w) ((fp) << 20 | (uint64_t)(g) << 14 | (uint64_t)(w))
#define KW_FP(kw) ((kw) >> 20)
#define KW_G(kw) ((unsigned)((kw) >> 14) & 63u)
#define KW_W(kw) ((uint32_t)(kw) & 0x3fffu)
#define SHARD_BITS 8
#define NSHARDS (1u << SHARD_BITS)
#define LOCAL_BITS 24
#define LOCAL_MASK ((1u << LOCAL_BITS) - 1)
#define MAX_BUCKETS (((size_t)LOCAL_MASK - 1) / BUCKET) /* per shard; keeps ids != NIL */
#define LOAD_MAX 920             /* per mille: a shard never runs fuller than 92 % */
#define LOAD_SPREAD 80           /* growing shards start at 84..92 %, so they grow at
                                    different times instead of all within a few requests */
#define INITIAL_BUCKETS 4        /* per shard: 256 × 256 B = 64 KiB for an idle model */
#define MAX_KICKS 128            /* cuckoo random-walk length before a shard counts as full */
#define SEED0 0x6b76726f75746531ull /* seed of block 0's key; any fixed value works */
#define MATCH_BATCH 16           /* blocks hashed ahead of their probes, to prefetch buckets */
#define BISECT_WORKERS 8         /* up to this many workers, match bisects each one's run
                                    (O(log blocks) probes each); more share one linear walk */
#define SWEEP_EVERY (1u << 21)   /* insert calls between two shards' age sweeps: each shard is
                                    swept every 256 × 2^21 = 2^29 calls */
#define MAX_AGE (1u << 29)       /* a sweep makes older stamps this old: so no stamp is ever
                                    2^30 calls old, and serial comparison (2^31) stays exact */

typedef struct slot {
    uint64_t kw;                 /* KW(fp, group, worker); 0 = empty */
    uint32_t prev;               /* towards the worker's most recently used entry */
    uint32_t next;               /* towards its least recently used entry */
} slot;

typedef struct shard {
    slot *slots;                 /* nb × BUCKET, 64-byte aligned */
    uint32_t *st;                /* nb × BUCKET: each slot's use stamp (see ix->clock); a
                                    parallel array, so matching reads none of it */
    size_t nb;                   /* buckets */
    size_t used;                 /* holdings */
} shard;

typedef struct wrec {
    size_t ext;                  /* registry id */
    size_t count;                /* holdings */
    size_t cap;                  /* 0 = default */
    size_t learned;              /* lower cap learned from corrections; 0 = none */
    uint32_t gen;                /* which record this is (a use snapshot names it) */
    uint32_t head;               /* most recently used slot */
    uint32_t tail;               /* least recently used slot: the next victim */
    int used;
    uint32_t *touch;             /* slots of this worker's holdings of chain blocks
                                    0..touch_n-1 as its last insert left them; only a hint,
                                    checked on use (a slot still holding (block, worker) is
                                    that holding: a worker holds a block in one slot at most).
                                    Per worker, so requests that alternate between workers
                                    each find their own; kept across forget (reused record) */
    size_t touch_n;
    size_t touch_alloc;
    uint64_t mod;                /* +1 on every change to this worker's list or to where its
                                    holdings sit (w_change) */
    uint64_t touch_mod;          /* mod when `ordered` was last established */
    int ordered;                 /* while mod == touch_mod: touch[0..touch_n) are this
                                    worker's touch_n most recent holdings, head first */
    int run_pending;             /* touch[0..touch_n)'s stamps are run_stamp, not yet written
                                    (w_settle writes them before anything reads or moves
                                    them); only while ordered and unchanged */
    uint32_t run_stamp;
} wrec;

struct kvr_prefix_index {
    size_t block_bytes;
    size_t max_keys;
    size_t default_cap;
    shard sh[NSHARDS];
    size_t used;                 /* holdings */
    size_t keys;                 /* distinct fingerprints */
    uint64_t evictions;
    uint64_t forgotten;
    uint64_t corrected;          /* holdings dropped by corrections */
    uint32_t clock;              /* +1 per insert call: the use stamp it gives what it touches */
    uint32_t wgen;               /* records made so far */
    size_t chain_n;              /* chain[0..chain_n) = the block keys of the text below */
    size_t chain_len;            /* that text's bytes; 0 = the chain is no text's (insert_keys) */
    char *chain_text;            /* a copy of that text: a request's insert after its match
                                    recognises the same bytes (memcmp, far cheaper than hashing
                                    them) and hashes no block again */
    size_t chain_text_alloc;
    uint64_t bound_id;           /* 0, or chain_text[0..bound_len) is the text of this id
                                    (kvr_prefix_keys text_id) */
    size_t bound_len;
    int match_valid;             /* the chain is the last match's, no insert since (match_use) */
    int chain_holes;             /* the running insert left a block of the chain unrecorded */
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
    size_t need_nb;              /* buckets a shard needs for its share of the caps' sum */
    uint32_t *rb_map;            /* during a shard rebuild: old local index -> new */
    uint32_t *rb_rev;            /* during a shard rebuild: new local index -> old */
};

static inline uint64_t fp_of(uint64_t key)
{
    uint64_t f = key >> 20;
    return f ? f : 1;
}

static inline unsigned shard_of(uint64_t fp)
{
    return (unsigned)(fp >> (44 - SHARD_BITS));
}

static inline uint32_t gid(unsigned sh, size_t local)
{
    return (uint32_t)sh << LOCAL_BITS | (uint32_t)local;
}

static inline slot *at(const kvr_prefix_index *ix, uint32_t id)
{
    return &ix->sh[id >> LOCAL_BITS].slots[id & LOCAL_MASK];
}

/* Lemire's range reduction: any bucket count works, so a shard can grow by 1.5x and stop at
 * what the caps need. */
static inline size_t reduce(uint64_t h, size_t nb)
{
    return (size_t)(((unsigned __int128)h * nb) >> 64);
}

static inline uint64_t mix(uint64_t h)
{
    return kvr_mix64(h);
}

/* The two candidate buckets of group g of fingerprint fp, in a shard of nb buckets. */
static inline void pair_of(size_t nb, uint64_t fp, unsigned g, size_t *b1, size_t *b2)
{
    uint64_t h = mix(fp * 0x9e3779b97f4a7c15ull + g);
    *b1 = reduce(h, nb);
    size_t x = reduce(mix(h), nb);
    *b2 = x != *b1 ? x : (*b1 + 1 == nb ? 0 : *b1 + 1);
}

static inline size_t other_bucket(size_t nb, uint64_t kw, size_t b)
{
    size_t b1, b2;
    pair_of(nb, KW_FP(kw), KW_G(kw), &b1, &b2);
    return b == b1 ? b2 : b1;
}

size_t kvr_prefix_index_block_keys(size_t block_bytes, const void *text, size_t len,
                                   uint64_t *keys, size_t max)
{
    return kvr_prefix_keys_get(NULL, block_bytes, text, len, keys, max);
}

size_t kvr_prefix_keys_get(const kvr_prefix_keys *kept, size_t block_bytes, const void *text,
                           size_t len, uint64_t *keys, size_t max)
{
    if (!block_bytes || !len)
        return 0;
    const char *p = text;
    size_t n = (len + block_bytes - 1) / block_bytes, i = 0;
    if (kept && kept->block_bytes == block_bytes) {
        i = kept->n < len / block_bytes ? kept->n : len / block_bytes;
        i = i < max ? i : max;
        memcpy(keys, kept->key, i * sizeof(*keys));
    }
    uint64_t seed = i ? keys[i - 1] : SEED0;
    for (; i < n && i < max; i++) {
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

/* Shard arrays and a growth step's temporary maps from 16 KiB up are mapped directly: they
 * come zeroed, and unmapping them after a growth step returns them to the system at once (from
 * the heap they would linger, counted in RSS). Smaller ones come from the heap, cache-line
 * aligned and zeroed. */
#define MMAP_MIN ((size_t)16 << 10)

static void *big_alloc(size_t bytes)
{
    if (bytes >= MMAP_MIN) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

static void big_free(void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes >= MMAP_MIN)
        munmap(p, bytes);
    else
        free(p);
}

static void free_arrays(shard *t)
{
    big_free(t->slots, t->nb * BUCKET * sizeof(slot));
    big_free(t->st, t->nb * BUCKET * sizeof(uint32_t));
    t->slots = NULL;
    t->st = NULL;
}

/* A shard's arrays for `nb` buckets, zeroed (used counts left at 0). Returns 0, or -1. */
static int alloc_arrays(shard *t, size_t nb)
{
    t->nb = nb;
    t->used = 0;
    t->slots = big_alloc(nb * BUCKET * sizeof(slot));
    t->st = big_alloc(nb * BUCKET * sizeof(uint32_t));
    if (t->slots && t->st)
        return 0;
    free_arrays(t);
    return -1;
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
    for (unsigned i = 0; i < NSHARDS; i++) {
        if (alloc_arrays(&ix->sh[i], INITIAL_BUCKETS) < 0) {
            kvr_prefix_index_destroy(ix);
            return NULL;
        }
    }
    return ix;
}

void kvr_prefix_index_destroy(kvr_prefix_index *ix)
{
    if (!ix)
        return;
    for (unsigned i = 0; i < NSHARDS; i++)
        free_arrays(&ix->sh[i]);
    for (size_t i = 0; i < ix->nw; i++)
        free(ix->w[i].touch);
    free(ix->w);
    free(ix->ext2int);
    free(ix->chain);
    free(ix->chain_text);
    free(ix->cset);
    free(ix->want);
    free(ix);
}

/* ---- table primitives ---------------------------------------------------------------- */

/* What a scan of a key's groups found. */
typedef struct kfind {
    uint32_t slot;       /* the holding of the asked worker, NIL if none */
    size_t holders;      /* holders of the key */
    unsigned last_g;     /* first group with fewer than GROUP holders: where a new one goes */
    uint32_t last;       /* slot of a holder in the last non-empty group (NIL: no holder) */
} kfind;

static void key_find(const kvr_prefix_index *ix, uint64_t fp, uint32_t wi, kfind *f)
{
    unsigned si = shard_of(fp);
    const shard *sh = &ix->sh[si];
    f->slot = f->last = NIL;
    f->holders = 0;
    for (unsigned g = 0; g < MAX_GROUPS; g++) {
        size_t b[2];
        pair_of(sh->nb, fp, g, &b[0], &b[1]);
        int c = 0;
        uint32_t any = NIL;
        for (int k = 0; k < 2; k++) {
            const slot *bk = sh->slots + b[k] * BUCKET;
            for (int j = 0; j < BUCKET; j++) {
                uint64_t kw = bk[j].kw;
                if (kw && KW_FP(kw) == fp && KW_G(kw) == g) {
                    c++;
                    any = gid(si, b[k] * BUCKET + (size_t)j);
                    if (KW_W(kw) == wi)
                        f->slot = any;
                }
            }
        }
        f->holders += (size_t)c;
        if (any != NIL)
            f->last = any;
        if (c < GROUP) {
            f->last_g = g;
            return;
        }
    }
    f->last_g = MAX_GROUPS; /* every group full: no room for another holder */
}

/* Moves the entry in local slot `src` of shard `si` (arrays `a`: the live shard or the one
 * being rebuilt) to the empty local slot `dst`, its use stamp with it. In the live table its
 * LRU neighbours (or its worker's list ends) are re-pointed; during a rebuild of that shard the
 * links are fixed afterwards, so only the old->new map is updated. */
static void w_change(kvr_prefix_index *ix, wrec *w);

static void move_slot(kvr_prefix_index *ix, unsigned si, shard *a, uint32_t src, uint32_t dst)
{
    slot *t = a->slots;
    if (!ix->rb_map) /* a rebuild settled every worker before it began */
        w_change(ix, &ix->w[KW_W(t[src].kw)]);
    t[dst] = t[src];
    a->st[dst] = a->st[src];
    t[src].kw = 0;
    if (ix->rb_map) {
        uint32_t old = ix->rb_rev[src];
        ix->rb_rev[dst] = old;
        ix->rb_map[old] = dst;
        return;
    }
    uint32_t id = gid(si, dst);
    wrec *w = &ix->w[KW_W(t[dst].kw)];
    if (t[dst].prev != NIL)
        at(ix, t[dst].prev)->next = id;
    else
        w->head = id;
    if (t[dst].next != NIL)
        at(ix, t[dst].next)->prev = id;
    else
        w->tail = id;
}

/* Removes the holding in slot `id` and keeps its key's groups dense: the key's last holder
 * moves into the hole (relabelled to the hole's group). Returns 1 when it was the key's last
 * holder. */
static int table_remove(kvr_prefix_index *ix, uint32_t id)
{
    slot *x = at(ix, id);
    uint64_t kw = x->kw, fp = KW_FP(kw);
    unsigned si = id >> LOCAL_BITS;
    kfind f;
    key_find(ix, fp, W_NONE, &f);
    x->kw = 0;
    ix->sh[si].used--;
    ix->used--;
    if (f.last != NIL && f.last != id) {
        move_slot(ix, si, &ix->sh[si], f.last & LOCAL_MASK, id & LOCAL_MASK);
        x->kw = KW(fp, KW_G(kw), KW_W(x->kw));
    }
    return f.holders <= 1;
}

static int free_slot(const slot *t, size_t b)
{
    for (int j = 0; j < BUCKET; j++)
        if (!t[b * BUCKET + (size_t)j].kw)
            return j;
    return -1;
}

static int free_count(const slot *t, size_t b)
{
    int n = 0;
    for (int j = 0; j < BUCKET; j++)
        n += !t[b * BUCKET + (size_t)j].kw;
    return n;
}

/* Stores entry `kw` in shard arrays `a` (live or being rebuilt): in the emptier of its two
 * buckets, else after a cuckoo walk that moves entries to their other bucket. Returns the local
 * slot (prev/next = NIL, stamp to be set by the caller), or NIL when the walk found no room
 * (the arrays are unchanged). */
static uint32_t table_place(kvr_prefix_index *ix, unsigned si, shard *a, uint64_t kw)
{
    slot *t = a->slots;
    size_t nb = a->nb, b1, b2;
    pair_of(nb, KW_FP(kw), KW_G(kw), &b1, &b2);
    int f1 = free_count(t, b1), f2 = free_count(t, b2);
    uint32_t s = NIL;
    if (f1 || f2) {
        size_t b = f1 >= f2 ? b1 : b2;
        s = (uint32_t)(b * BUCKET + (size_t)free_slot(t, b));
    } else {
        /* Record a walk over distinct slots first, then shift the entries back along it from
         * the free slot found at its end, so a failed walk changes nothing. */
        uint32_t path[MAX_KICKS];
        size_t b = kvr_rand_below(2) ? b1 : b2, fb = 0;
        int n = 0, f = -1;
        while (n < MAX_KICKS) {
            int j = (int)kvr_rand_below(BUCKET), tries;
            for (tries = 0; tries < BUCKET; tries++, j = (j + 1) % BUCKET) {
                uint32_t cand = (uint32_t)(b * BUCKET + (size_t)j);
                int seen = 0;
                for (int i = 0; i < n && !seen; i++)
                    seen = path[i] == cand;
                if (!seen)
                    break;
            }
            if (tries == BUCKET)
                break;
            uint32_t cur = (uint32_t)(b * BUCKET + (size_t)j);
            path[n++] = cur;
            size_t ob = other_bucket(nb, t[cur].kw, b);
            if ((f = free_slot(t, ob)) >= 0) {
                fb = ob;
                break;
            }
            b = ob;
        }
        if (f < 0)
            return NIL;
        uint32_t dst = (uint32_t)(fb * BUCKET + (size_t)f);
        for (int i = n - 1; i >= 0; i--) {
            move_slot(ix, si, a, path[i], dst);
            dst = path[i];
        }
        s = dst;
    }
    t[s].kw = kw;
    t[s].prev = t[s].next = NIL;
    return s;
}

/* ---- per-worker LRU ------------------------------------------------------------------- */

/* Writes a worker's deferred run stamps (see insert_chain's repeat case). */
static void w_settle(kvr_prefix_index *ix, wrec *w)
{
    if (!w->run_pending)
        return;
    w->run_pending = 0;
    uint32_t wi = (uint32_t)(w - ix->w);
    for (size_t k = 0; k < w->touch_n; k++) {
        uint32_t id = w->touch[k];
        if (KW_W(at(ix, id)->kw) == wi) /* always, while pending; a guard for other workers */
            ix->sh[id >> LOCAL_BITS].st[id & LOCAL_MASK] = w->run_stamp;
    }
}

static void settle_all(kvr_prefix_index *ix)
{
    for (size_t i = 0; i < ix->nw; i++)
        w_settle(ix, &ix->w[i]);
}

/* Called before anything changes worker `w`'s list or moves one of its holdings. */
static void w_change(kvr_prefix_index *ix, wrec *w)
{
    w_settle(ix, w);
    w->mod++;
}

static void lru_unlink(kvr_prefix_index *ix, wrec *w, uint32_t id)
{
    w_change(ix, w);
    slot *x = at(ix, id);
    if (x->prev != NIL)
        at(ix, x->prev)->next = x->next;
    else
        w->head = x->next;
    if (x->next != NIL)
        at(ix, x->next)->prev = x->prev;
    else
        w->tail = x->prev;
}

/* Every touch stamps the holding with the current insert call, so stamps never decrease from a
 * worker's LRU tail to its head. */
static void lru_push_head(kvr_prefix_index *ix, wrec *w, uint32_t id)
{
    w_change(ix, w);
    ix->sh[id >> LOCAL_BITS].st[id & LOCAL_MASK] = ix->clock;
    slot *x = at(ix, id);
    x->prev = NIL;
    x->next = w->head;
    if (w->head != NIL)
        at(ix, w->head)->prev = id;
    else
        w->tail = id;
    w->head = id;
}

/* ---- workers ------------------------------------------------------------------------- */

static void update_need(kvr_prefix_index *ix);

/* The cap before corrections: set, else the default, within the global cap. */
static size_t base_cap(const kvr_prefix_index *ix, const wrec *w)
{
    size_t c = w && w->cap ? w->cap : ix->default_cap;
    return c < ix->max_keys ? c : ix->max_keys;
}

static size_t eff_cap(const kvr_prefix_index *ix, const wrec *w)
{
    size_t c = base_cap(ix, w);
    return w && w->learned && w->learned < c ? w->learned : c;
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
        if (nw)
            ix->w = nw;
        uint32_t *want = realloc(ix->want, (ix->nw + 1) * sizeof(*want));
        if (want)
            ix->want = want;
        if (!nw || !want)
            return -1;
        ix->want[ix->nw] = 0;
        memset(&ix->w[ix->nw], 0, sizeof(*ix->w));
        ix->nw++;
    }
    wrec *w = &ix->w[i];
    uint32_t *touch = w->touch; /* a reused record keeps its scratch, not its hint */
    size_t touch_alloc = w->touch_alloc;
    memset(w, 0, sizeof(*w));
    w->touch = touch;
    w->touch_alloc = touch_alloc;
    w->ext = ext;
    w->head = w->tail = NIL;
    w->used = 1;
    w->gen = ++ix->wgen;
    ix->ext2int[ext] = (uint32_t)i + 1;
    update_need(ix);
    return (long)i;
}

/* ---- eviction and growth -------------------------------------------------------------- */

static void evict_slot(kvr_prefix_index *ix, uint32_t id)
{
    wrec *w = &ix->w[KW_W(at(ix, id)->kw)];
    lru_unlink(ix, w, id);
    w->count--;
    if (table_remove(ix, id))
        ix->keys--;
    ix->evictions++;
}

static void evict_one(kvr_prefix_index *ix, uint32_t wi)
{
    evict_slot(ix, ix->w[wi].tail);
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

/* Rebuilds shard `si` with `nb` buckets. Its slot ids change, so its entries' links, the links
 * of their neighbours in other shards and the workers' list ends are re-pointed through an
 * old -> new map. O(holdings in the shard). Returns 0, or -1 (shard unchanged) out of memory or
 * when the entries do not fit. */
static int rebuild(kvr_prefix_index *ix, unsigned si, size_t nb)
{
    shard *sh = &ix->sh[si], na;
    size_t old_n = sh->nb * BUCKET, new_n = nb * BUCKET;
    int got = alloc_arrays(&na, nb);
    slot *ns = na.slots;
    uint32_t *map = big_alloc(old_n * sizeof(uint32_t)), *rev = big_alloc(new_n * sizeof(uint32_t));
    if (got < 0 || !map || !rev) {
        if (got == 0)
            free_arrays(&na);
        big_free(map, old_n * sizeof(uint32_t));
        big_free(rev, new_n * sizeof(uint32_t));
        return -1;
    }
    settle_all(ix);
    ix->rb_map = map;
    ix->rb_rev = rev;
    int ok = 1;
    for (size_t s = 0; s < old_n; s++) {
        /* Prefetch the buckets of an entry a few slots ahead: placement is a random access. */
        if (s + 16 < old_n && sh->slots[s + 16].kw) {
            uint64_t kw = sh->slots[s + 16].kw;
            size_t p1, p2;
            pair_of(nb, KW_FP(kw), KW_G(kw), &p1, &p2);
            __builtin_prefetch(ns + p1 * BUCKET, 1);
            __builtin_prefetch(ns + p2 * BUCKET, 1);
        }
        const slot *o = &sh->slots[s];
        if (!o->kw)
            continue;
        uint32_t t = table_place(ix, si, &na, o->kw);
        if (t == NIL) {
            ok = 0;
            break;
        }
        na.st[t] = sh->st[s];
        ns[t].prev = o->prev;
        ns[t].next = o->next;
        map[s] = t;
        rev[t] = (uint32_t)s;
    }
    ix->rb_map = ix->rb_rev = NULL;
    big_free(rev, new_n * sizeof(uint32_t));
    if (!ok) {
        free_arrays(&na);
        big_free(map, old_n * sizeof(uint32_t));
        return -1;
    }
    /* Links into this shard are translated; neighbours in other shards are told the new id. */
    for (size_t t = 0; t < new_n; t++) {
        slot *x = &ns[t];
        if (!x->kw)
            continue;
        uint32_t id = gid(si, t);
        if (x->prev != NIL) {
            if (x->prev >> LOCAL_BITS == si)
                x->prev = gid(si, map[x->prev & LOCAL_MASK]);
            else
                at(ix, x->prev)->next = id;
        }
        if (x->next != NIL) {
            if (x->next >> LOCAL_BITS == si)
                x->next = gid(si, map[x->next & LOCAL_MASK]);
            else
                at(ix, x->next)->prev = id;
        }
    }
    for (size_t i = 0; i < ix->nw; i++) {
        wrec *w = &ix->w[i];
        if (!w->used)
            continue;
        if (w->head != NIL && w->head >> LOCAL_BITS == si)
            w->head = gid(si, map[w->head & LOCAL_MASK]);
        if (w->tail != NIL && w->tail >> LOCAL_BITS == si)
            w->tail = gid(si, map[w->tail & LOCAL_MASK]);
    }
    big_free(map, old_n * sizeof(uint32_t));
    free_arrays(sh);
    sh->slots = na.slots;
    sh->st = na.st;
    sh->nb = nb;
    for (size_t i = 0; i < ix->nw; i++) {
        ix->w[i].touch_n = 0; /* the slots a hint named may lie past this shard's arrays */
        ix->w[i].mod++;
    }
    return 0;
}

/* Buckets that hold `holdings` at the highest load. */
static size_t buckets_for(double holdings)
{
    double nb = (holdings * 1000 / LOAD_MAX + 1) / BUCKET + 1;
    return nb >= (double)MAX_BUCKETS ? MAX_BUCKETS : (size_t)nb;
}

/* Holdings never exceed the sum of the workers' caps; a shard gets 1/256 of them plus two
 * standard deviations (the few shards drawing more grow by small steps). Recomputed when
 * workers or caps change. */
static void update_need(kvr_prefix_index *ix)
{
    double bound = 0;
    for (size_t i = 0; i < ix->nw; i++)
        if (ix->w[i].used)
            bound += (double)eff_cap(ix, &ix->w[i]);
    double per = bound / NSHARDS;
    ix->need_nb = buckets_for(per + 2 * sqrt(per) + 8);
}

/* Load (per mille) above which shard `si` grows: staggered while it is below the size the caps
 * need, the maximum after. */
static unsigned grow_threshold(const kvr_prefix_index *ix, unsigned si)
{
    if (ix->sh[si].nb >= ix->need_nb)
        return LOAD_MAX;
    return LOAD_MAX - LOAD_SPREAD + (unsigned)((si * 37u) % NSHARDS) * LOAD_SPREAD / (NSHARDS - 1);
}

/* Grows shard `si`: 1.25x steps, but not past the size the caps need, so a full index sits near
 * the highest load. Past that size (a shard drawing more than its share, or a failed cuckoo
 * walk) it grows by 1/16 steps. */
static int grow(kvr_prefix_index *ix, unsigned si)
{
    shard *sh = &ix->sh[si];
    if (sh->nb >= MAX_BUCKETS)
        return -1;
    size_t nb = sh->nb + sh->nb / 4 + 1, small = sh->nb + sh->nb / 16 + 1;
    if (nb > ix->need_nb)
        nb = ix->need_nb > sh->nb ? ix->need_nb : small;
    if (nb > MAX_BUCKETS)
        nb = MAX_BUCKETS;
    for (int attempt = 0; attempt < 3; attempt++) {
        if (rebuild(ix, si, nb) == 0)
            return 0;
        nb += nb / 8 + 1; /* entries did not fit (never seen at these loads): a bit bigger */
        if (nb > MAX_BUCKETS)
            return -1;
    }
    return -1;
}

/* Stores entry `kw` (a holding not yet in the table) in its shard: grows the shard past the
 * load target or when the cuckoo walk fails; if it cannot grow (out of memory, 2^24 slots),
 * frees room by evicting, least recent first from the biggest holder, and as a last resort an
 * occupant of one of the two buckets. Returns the slot id or NIL (out of memory). `*evicted` =
 * other holdings went (the caller's view of the key may be stale). */
static uint32_t place_live(kvr_prefix_index *ix, uint64_t kw, int *evicted)
{
    unsigned si = shard_of(KW_FP(kw));
    shard *sh = &ix->sh[si];
    *evicted = 0;
    if ((sh->used + 1) * 1000 > sh->nb * BUCKET * grow_threshold(ix, si))
        grow(ix, si);
    for (int round = 0; round < 64; round++) {
        uint32_t s = table_place(ix, si, sh, kw);
        if (s != NIL) {
            sh->used++;
            ix->used++;
            return gid(si, s);
        }
        if (grow(ix, si) == 0)
            continue;
        *evicted = 1;
        if (round < 48) {
            size_t second;
            long big = largest_worker(ix, &second);
            if (big >= 0) {
                evict_one(ix, (uint32_t)big);
                continue;
            }
        }
        size_t b1, b2;
        pair_of(sh->nb, KW_FP(kw), KW_G(kw), &b1, &b2);
        size_t victim = b1 * BUCKET + kvr_rand_below(BUCKET);
        if (sh->slots[victim].kw)
            evict_slot(ix, gid(si, victim));
    }
    return NIL;
}

/* ---- use stamps ------------------------------------------------------------------------ */

/* Serial-number order (RFC 1982) of 32-bit stamps: the clock wraps every 2^32 insert calls. */
static inline int stamp_le(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) <= 0;
}

/* Raises stamps older than MAX_AGE in shard `si` to that age. Without it a holding left
 * untouched for 2^31 calls would compare as newer than everything; with it every stamp stays
 * within 2^30 calls of the clock. Stamps younger than MAX_AGE are never changed, so
 * corrections are exact about everything used within the last 2^29 insert calls; among older
 * holdings (raised at different times in different shards) their order is approximate. */
static void age_sweep(kvr_prefix_index *ix, unsigned si)
{
    shard *sh = &ix->sh[si];
    uint32_t floor = ix->clock - MAX_AGE;
    settle_all(ix);
    for (size_t i = 0, n = sh->nb * BUCKET; i < n; i++)
        if (sh->slots[i].kw && (int32_t)(sh->st[i] - floor) < 0)
            sh->st[i] = floor;
}

/* Advances the clock by `n` insert calls, sweeping one shard every SWEEP_EVERY of them (a
 * 10 M-block index sweeps ~40 K slots each time, spread over the traffic). */
static void clock_advance(kvr_prefix_index *ix, uint64_t n)
{
    while (n) {
        uint32_t to_next = SWEEP_EVERY - ix->clock % SWEEP_EVERY;
        if (n < to_next) {
            ix->clock += (uint32_t)n;
            return;
        }
        ix->clock += to_next;
        n -= to_next;
        age_sweep(ix, (ix->clock / SWEEP_EVERY) % NSHARDS);
    }
}

void kvr_prefix_index_tick(kvr_prefix_index *ix, uint64_t calls)
{
    clock_advance(ix, calls);
}

/* ---- public operations ---------------------------------------------------------------- */

/* Grows the scratch array *arr (*alloc elements of `size` bytes) to hold n, doubling from
 * 64. 0, or -1 (unchanged) when memory ran out. */
static int grow_scratch(void **arr, size_t *alloc, size_t size, size_t n)
{
    if (n <= *alloc)
        return 0;
    size_t a = *alloc ? *alloc : 64;
    while (a < n)
        a *= 2;
    void *p = realloc(*arr, a * size);
    if (!p)
        return -1;
    *arr = p;
    *alloc = a;
    return 0;
}

static int grow_chain(kvr_prefix_index *ix, size_t n)
{
    void *p = ix->chain;
    int rc = grow_scratch(&p, &ix->chain_alloc, sizeof(*ix->chain), n);
    ix->chain = p;
    return rc;
}

/* Makes ix->chain name the block keys of `text` (len > 0): kept when it already does (the
 * same bytes, as a request's insert after its match), emptied otherwise. The first `same`
 * bytes (<= both lengths) are known equal to the bound text's and are not compared again. */
static void chain_bind(kvr_prefix_index *ix, const void *text, size_t len, size_t same)
{
    size_t keep = 0, from = 0, both = len < ix->chain_len ? len : ix->chain_len;
    if (ix->chain_len &&
        !memcmp(ix->chain_text + same, (const char *)text + same, both - same)) {
        if (len == ix->chain_len)
            return;
        if (len < ix->chain_len) {
            /* A prefix of the bound text (a prompt matched after its own reply was taught,
             * as concurrent requests of one conversation interleave): its full blocks' keys
             * stay. */
            if (ix->chain_n > len / ix->block_bytes)
                ix->chain_n = len / ix->block_bytes;
            ix->chain_len = len;
            if (len < ix->bound_len)
                ix->bound_id = 0;
            return;
        }
        /* The text goes on (a reply taught after its prompt, the next turn after both): the
         * keys of its old full blocks stay, only the old partial block's is redone. */
        keep = ix->chain_len / ix->block_bytes;
        from = ix->chain_len;
    } else if (same) {
        keep = same / ix->block_bytes; /* a whole number of blocks (bind_text) */
        from = same;
    }
    if (ix->chain_n > keep)
        ix->chain_n = keep;
    ix->chain_len = 0;
    if (from < ix->bound_len)
        ix->bound_id = 0;
    if (len > ix->chain_text_alloc) {
        char *p = realloc(ix->chain_text, len);
        if (!p) {
            ix->chain_n = 0;
            return; /* the chain then names no text: the next call hashes again */
        }
        ix->chain_text = p;
        ix->chain_text_alloc = len;
    }
    memcpy(ix->chain_text + from, (const char *)text + from, len - from);
    ix->chain_len = len;
}

void kvr_prefix_keys_free(kvr_prefix_keys *k)
{
    if (!k)
        return;
    free(k->key);
    memset(k, 0, sizeof(*k));
}

/* Binds the chain to `text` (chain_bind), starting from a request's kept keys when they are
 * for this block size: the keys of the text's full blocks the request hashed before (a prefix
 * of them when the text is shorter now). When they are the chain's own, the chain keeps its
 * text and compares only past them; else it takes them and names no text (chain_len 0), and a
 * later call without kept keys hashes again. Returns `kept` when it was used (the call's new
 * keys go back there, kept_save), else NULL. */
static kvr_prefix_keys *bind_text_keys(kvr_prefix_index *ix, const void *text, size_t len,
                                       kvr_prefix_keys *kept, size_t same_id);

static kvr_prefix_keys *bind_text(kvr_prefix_index *ix, const void *text, size_t len,
                                  kvr_prefix_keys *kept)
{
    /* A text whose id is the bound text's (the same messages resent, as a conversation's
     * requests resend them all): its first bound_len bytes are the bound ones and are not
     * compared (the id stands for them, as a block key stands for its block). */
    size_t same_id = 0;
    if (kept && kept->text_id && kept->text_id == ix->bound_id &&
        kept->text_id_len == ix->bound_len && ix->bound_len <= ix->chain_len &&
        ix->bound_len <= len)
        same_id = ix->bound_len;
    kvr_prefix_keys *r = bind_text_keys(ix, text, len, kept, same_id);
    if (kept && kept->text_id && kept->text_id_len && ix->chain_len >= kept->text_id_len) {
        ix->bound_id = kept->text_id; /* the chain's text is now this one's */
        ix->bound_len = kept->text_id_len;
    }
    return r;
}

static kvr_prefix_keys *bind_text_keys(kvr_prefix_index *ix, const void *text, size_t len,
                                       kvr_prefix_keys *kept, size_t same_id)
{
    if (!kept || (kept->block_bytes && kept->block_bytes != ix->block_bytes)) {
        chain_bind(ix, text, len, same_id);
        return NULL;
    }
    size_t full = len / ix->block_bytes, k = kept->n < full ? kept->n : full;
    /* The bound text is this one's (all requests of one conversation in a row, as on the
     * bench): equal keys say its first k blocks are these bytes, as they say for the index,
     * and only the rest is compared. The binding stays for the next request's match. */
    if (k && ix->chain_n >= k && ix->chain_len >= k * ix->block_bytes &&
        !memcmp(ix->chain, kept->key, k * sizeof(*kept->key))) {
        size_t same = k * ix->block_bytes;
        chain_bind(ix, text, len, same > same_id ? same : same_id);
        return kept;
    }
    if (!k || grow_chain(ix, k) < 0) {
        chain_bind(ix, text, len, same_id);
        return kept;
    }
    memcpy(ix->chain, kept->key, k * sizeof(*kept->key));
    ix->chain_n = k;
    ix->chain_len = 0;
    ix->bound_id = 0;
    return kept;
}

/* Keeps the full blocks' keys the chain (bound to a text of `len` bytes) has beyond the
 * request's kept ones. Out of memory keeps fewer: they are only a saving. */
static void kept_save(const kvr_prefix_index *ix, size_t len, kvr_prefix_keys *kept)
{
    size_t full = len / ix->block_bytes, have = ix->chain_n < full ? ix->chain_n : full;
    if (have <= kept->n)
        return;
    void *p = kept->key;
    if (grow_scratch(&p, &kept->alloc, sizeof(*kept->key), have) < 0)
        return;
    kept->key = p;
    memcpy(kept->key + kept->n, ix->chain + kept->n, (have - kept->n) * sizeof(*kept->key));
    kept->n = have;
    kept->block_bytes = ix->block_bytes;
}

/* Hashes the bound text's block keys up to block `upto` (exclusive). -1 when memory ran out. */
static int chain_hash(kvr_prefix_index *ix, const char *p, size_t len, size_t upto)
{
    if (upto <= ix->chain_n)
        return 0;
    if (grow_chain(ix, upto) < 0)
        return -1;
    size_t B = ix->block_bytes;
    uint64_t seed = ix->chain_n ? ix->chain[ix->chain_n - 1] : SEED0;
    for (size_t i = ix->chain_n; i < upto; i++) {
        size_t off = i * B, bl = len - off < B ? len - off : B;
        seed = XXH3_64bits_withSeed(p + off, bl, seed);
        ix->chain[i] = seed;
    }
    ix->chain_n = upto;
    return 0;
}

/* 1 when slot `id` holds fingerprint `fp` for worker slot `wi`. */
static inline int slot_holds(const kvr_prefix_index *ix, uint32_t id, uint64_t fp, uint32_t wi)
{
    uint64_t kw = at(ix, id)->kw;
    return kw && KW_FP(kw) == fp && KW_W(kw) == wi;
}

/* Worker slot `wi`'s holding of chain block `block` (fingerprint `fp`) when its last insert's
 * hint still names it (the worker's own conversation, the usual case), else NIL. */
static inline uint32_t hinted(const kvr_prefix_index *ix, uint32_t wi, size_t block,
                              uint64_t fp)
{
    const wrec *w = &ix->w[wi];
    return block < w->touch_n && slot_holds(ix, w->touch[block], fp, wi) ? w->touch[block]
                                                                         : NIL;
}

/* Whether worker slot `wi` holds chain block `block`: one load when hinted, else a lookup. */
static int holds(const kvr_prefix_index *ix, uint32_t wi, size_t block)
{
    uint64_t fp = fp_of(ix->chain[block]);
    if (hinted(ix, wi, block, fp) != NIL)
        return 1;
    kfind f;
    key_find(ix, fp, wi, &f);
    return f.slot != NIL;
}

/* Leading blocks of the chain's first `n` that worker slot `wi` holds. What a worker holds is
 * prefix-closed (header), so galloping then bisecting finds the run's end in O(log n) probes
 * instead of one per block. Hashes the chain as far as it probes when `text` is given (else it
 * must be hashed to n already). SIZE_MAX when memory ran out. */
static size_t held_run(kvr_prefix_index *ix, uint32_t wi, const char *text, size_t len, size_t n)
{
    size_t good = 0, bad = n, step = 1;
    while (good < bad) {
        size_t x = good + step - 1 < bad ? good + step - 1 : bad - 1;
        if (text && chain_hash(ix, text, len, x + 1) < 0)
            return SIZE_MAX;
        if (!holds(ix, wi, x)) {
            bad = x;
            break;
        }
        good = x + 1;
        step *= 2;
    }
    while (good < bad) {
        size_t x = good + (bad - good) / 2;
        if (holds(ix, wi, x))
            good = x + 1;
        else
            bad = x;
    }
    return good;
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

/* always_inline: GCC 12 otherwise judged this call free of effects where touch_run calls it
 * and dropped it (a function whose only statements are prefetches counts as pure). */
static inline __attribute__((always_inline)) void prefetch_buckets(const kvr_prefix_index *ix,
                                                                   uint64_t fp)
{
    const shard *sh = &ix->sh[shard_of(fp)];
    size_t b1, b2;
    pair_of(sh->nb, fp, 0, &b1, &b2);
    __builtin_prefetch(sh->slots + b1 * BUCKET);
    __builtin_prefetch(sh->slots + b2 * BUCKET);
}

/* Records the first `m` keys of ix->chain (already within the worker's cap) under worker
 * slot `wi`: the common part of insert and insert_keys. */
static int insert_chain(kvr_prefix_index *ix, uint32_t wi, size_t m, size_t cap, int new_only);

int kvr_prefix_index_insert(kvr_prefix_index *ix, size_t worker, const void *text, size_t len)
{
    return kvr_prefix_index_insert_kept(ix, worker, text, len, NULL);
}

static int insert_text(kvr_prefix_index *ix, size_t worker, const void *text, size_t len,
                       kvr_prefix_keys *kept, int new_only);

int kvr_prefix_index_insert_kept(kvr_prefix_index *ix, size_t worker, const void *text,
                                 size_t len, kvr_prefix_keys *kept)
{
    return insert_text(ix, worker, text, len, kept, 0);
}

int kvr_prefix_index_insert_new(kvr_prefix_index *ix, size_t worker, const void *text,
                                size_t len, kvr_prefix_keys *kept)
{
    return insert_text(ix, worker, text, len, kept, 1);
}

static int insert_text(kvr_prefix_index *ix, size_t worker, const void *text, size_t len,
                       kvr_prefix_keys *kept, int new_only)
{
    if (!len)
        return 0;
    long wl = worker_get(ix, worker);
    if (wl < 0)
        return -1;
    uint32_t wi = (uint32_t)wl;
    clock_advance(ix, 1);
    ix->match_valid = 0;
    size_t B = ix->block_bytes, nblocks = (len + B - 1) / B;
    size_t cap = eff_cap(ix, &ix->w[wi]);
    /* Blocks past the cap would be evicted again at once (they are the least recent). */
    size_t m = nblocks < cap ? nblocks : cap;
    kept = bind_text(ix, text, len, kept);
    if (chain_hash(ix, text, len, m) < 0)
        return -1;
    if (kept)
        kept_save(ix, len, kept);
    return insert_chain(ix, wi, m, cap, new_only);
}

int kvr_prefix_index_insert_keys(kvr_prefix_index *ix, size_t worker, const uint64_t *keys,
                                 size_t n)
{
    if (!n)
        return 0;
    long wl = worker_get(ix, worker);
    if (wl < 0)
        return -1;
    uint32_t wi = (uint32_t)wl;
    clock_advance(ix, 1);
    ix->match_valid = 0;
    ix->chain_len = ix->chain_n = 0; /* the chain becomes these keys, no text's */
    ix->bound_id = 0;
    size_t cap = eff_cap(ix, &ix->w[wi]);
    size_t m = n < cap ? n : cap;
    if (grow_chain(ix, m) < 0)
        return -1;
    memcpy(ix->chain, keys, m * sizeof(*keys));
    return insert_chain(ix, wi, m, cap, 0);
}

/* Touches the first `h` blocks of the chain, which worker slot `wi` holds, making block 0 its
 * most recent holding and each next block the one after it. A worker's last insert of a text
 * left its blocks consecutive in its LRU list, in that order: the slots are found by
 * following the list (one probe per break in it), and each consecutive stretch is moved as a
 * whole. Returns -1, changing nothing, when a block is not held after all (a hole: holdings
 * are not prefix-closed after a group overflowed) or memory ran out. */
static int grow_touch(kvr_prefix_index *ix, uint32_t wi, size_t n)
{
    wrec *w = &ix->w[wi];
    void *p = w->touch;
    int rc = grow_scratch(&p, &w->touch_alloc, sizeof(*w->touch), n);
    w->touch = p;
    return rc;
}

static int touch_run(kvr_prefix_index *ix, uint32_t wi, size_t h)
{
    if (grow_touch(ix, wi, h) < 0)
        return -1;
    w_change(ix, &ix->w[wi]); /* before any stamp is written: a deferred one is older */
    uint32_t *id = ix->w[wi].touch;
    size_t k = 0;
    /* A request teaches its prompt when the answer starts and prompt + reply when it ends: the
     * second finds the slots the first left here, unless the table moved them meanwhile. A
     * worker holds a block in one slot at most, so a slot still holding (block, worker) is
     * it; these loads do not depend on each other, unlike the walk below. */
    size_t lim = h < ix->w[wi].touch_n ? h : ix->w[wi].touch_n;
    while (k < lim && slot_holds(ix, id[k], fp_of(ix->chain[k]), wi))
        k++;
    ix->w[wi].touch_n = 0;
    /* Each step reads the slot the previous one links to: a chain of dependent loads over a
     * table much larger than the cache. Block k's slot lies in one of its key's two buckets,
     * known from its key alone, so fetching them 8 blocks ahead overlaps those misses. */
    for (size_t j = k; j < h && j < k + 8; j++)
        prefetch_buckets(ix, fp_of(ix->chain[j]));
    for (; k < h; k++) {
        if (k + 8 < h)
            prefetch_buckets(ix, fp_of(ix->chain[k + 8]));
        uint64_t fp = fp_of(ix->chain[k]);
        uint32_t nx = k ? at(ix, id[k - 1])->next : NIL;
        if (nx != NIL && KW_FP(at(ix, nx)->kw) == fp) {
            id[k] = nx;
            continue;
        }
        kfind f;
        key_find(ix, fp, wi, &f);
        if (f.slot == NIL)
            return -1;
        id[k] = f.slot;
    }
    /* Last stretch first, each to the head: block 0 ends up most recent. A stretch is what is
     * linked in block order now (after the moves of the later ones). */
    wrec *w = &ix->w[wi];
    for (size_t end = h; end > 0;) {
        size_t start = end - 1;
        while (start > 0 && at(ix, id[start - 1])->next == id[start])
            start--;
        uint32_t a = id[start], b = id[end - 1];
        if (w->head != a) {
            slot *sa = at(ix, a), *sb = at(ix, b);
            if (sa->prev != NIL)
                at(ix, sa->prev)->next = sb->next;
            else
                w->head = sb->next;
            if (sb->next != NIL)
                at(ix, sb->next)->prev = sa->prev;
            else
                w->tail = sa->prev;
            sa->prev = NIL;
            sb->next = w->head;
            if (w->head != NIL)
                at(ix, w->head)->prev = b;
            else
                w->tail = b;
            w->head = a;
        }
        for (size_t k = start; k < end; k++)
            ix->sh[id[k] >> LOCAL_BITS].st[id[k] & LOCAL_MASK] = ix->clock;
        end = start;
    }
    return 0;
}

static int insert_blocks(kvr_prefix_index *ix, uint32_t wi, size_t from, size_t m, size_t cap);

/* kvr_prefix_index_insert_new's placement: blocks [h, m), just pushed to the head of the
 * worker's list by insert_blocks, move as one stretch to right behind block h-1's holding and
 * take its stamp. So they rank just below their ancestors, in the order a full touch would
 * leave them, and no held block is read. The stretch is found from the head (a cuckoo walk
 * may have moved a slot insert_blocks recorded). 0, or -1 (nothing moved) when the head is
 * not that stretch: the caller then touches the held run as insert does. */
static int place_behind(kvr_prefix_index *ix, uint32_t wi, size_t h, size_t m)
{
    wrec *w = &ix->w[wi];
    w_change(ix, w);
    uint32_t *id = w->touch;
    uint32_t b = w->head;
    for (size_t k = h; k < m; k++) {
        if (k > h)
            b = at(ix, b)->next;
        if (b == NIL || KW_FP(at(ix, b)->kw) != fp_of(ix->chain[k]))
            return -1;
        id[k] = b;
    }
    kfind f;
    key_find(ix, fp_of(ix->chain[h - 1]), wi, &f);
    if (f.slot == NIL)
        return -1;
    uint32_t x = f.slot, a = id[h];
    /* unlink the stretch a..b from the head (x, not in it, keeps the list non-empty) */
    w->head = at(ix, b)->next;
    at(ix, w->head)->prev = NIL;
    /* and link it after x */
    slot *sx = at(ix, x);
    at(ix, a)->prev = x;
    at(ix, b)->next = sx->next;
    if (sx->next != NIL)
        at(ix, sx->next)->prev = b;
    else
        w->tail = b;
    sx->next = a;
    uint32_t st = ix->sh[x >> LOCAL_BITS].st[x & LOCAL_MASK];
    for (size_t k = h; k < m; k++)
        ix->sh[id[k] >> LOCAL_BITS].st[id[k] & LOCAL_MASK] = st;
    return 0;
}

/* Room for kvr_prefix_index_insert_new's blocks: evicts the worker's least recent holdings
 * until `want` of them fit its cap, while they are not blocks of this text (whose held run the
 * insert leaves where it is, so it may be among them). Stops at the first that is: the insert
 * then touches the run as a full insert does, whose rule evicts these same blocks first.
 * -1 when memory ran out. */
static int make_room_behind(kvr_prefix_index *ix, uint32_t wi, size_t m, size_t want,
                            size_t cap)
{
    wrec *w = &ix->w[wi];
    if (want <= cap)
        return 0;
    size_t need = want - cap;
    /* A few victims are checked against the chain directly; more pay for its set once. */
    int set = need > 4;
    if (set && cset_build(ix, m) < 0)
        return -1;
    for (; need; need--) {
        uint64_t fp = KW_FP(at(ix, w->tail)->kw);
        size_t k = 0;
        while (!set && k < m && fp_of(ix->chain[k]) != fp)
            k++;
        if (set ? cset_has(ix, fp) : k < m)
            return 0;
        evict_one(ix, wi);
    }
    return 0;
}

static int insert_chain(kvr_prefix_index *ix, uint32_t wi, size_t m, size_t cap, int new_only)
{
    wrec *wr = &ix->w[wi];
    /* The same text again, nothing changed on this worker since its last insert (the same
     * prompt and reply taught by every request of a conversation repeated as is, or by
     * retries): its m blocks are still its m most recent holdings in order, so the insert
     * only gives them this call's stamp, and that is deferred (w_settle writes it before
     * anything else reads or moves them). Keys are chained: block m-1's names blocks 0..m-1. */
    if (wr->ordered && wr->mod == wr->touch_mod && m && m == wr->touch_n &&
        hinted(ix, wi, m - 1, fp_of(ix->chain[m - 1])) != NIL) {
        if (!new_only) { /* insert_new refreshes nothing the worker holds */
            wr->run_pending = 1;
            wr->run_stamp = ix->clock;
        }
        return 0;
    }
    /* The usual insert repeats a text the worker mostly holds (the next turn of its
     * conversation): only the blocks past its held run are looked up one by one. */
    size_t h = ix->w[wi].count ? held_run(ix, wi, NULL, 0, m) : 0;
    ix->chain_holes = 0;
    if (grow_touch(ix, wi, m) < 0)
        return -1;
    new_only = new_only && h;
    if (new_only && h == m)
        return 0;
    if (new_only && make_room_behind(ix, wi, m, ix->w[wi].count + (m - h), cap) < 0)
        return -1;
    new_only = new_only && ix->w[wi].count + (m - h) <= cap;
    int rc = insert_blocks(ix, wi, h, m, cap);
    int behind = rc == 0 && h && new_only && place_behind(ix, wi, h, m) == 0;
    if (rc == 0 && h && !behind && touch_run(ix, wi, h) < 0)
        rc = insert_blocks(ix, wi, 0, h, cap);
    /* touch[] now names blocks 0..m-1's slots (insert_blocks records those it finds or
     * places; after place_behind, blocks 0..h-1's are the last insert's, a hint checked on
     * use): the reply's insert that usually follows reuses them. */
    ix->w[wi].touch_n = rc == 0 ? m : 0;
    while (ix->w[wi].count > cap)
        evict_one(ix, wi);
    enforce_global_cap(ix);
    /* Blocks 0..m-1 now lead the worker's list in order (insert_blocks pushed the new ones
     * last to first, touch_run put the held run before them; evictions take the tail, which
     * is never one of them while m blocks remain), unless place_behind left the held run
     * where it was. */
    wr = &ix->w[wi];
    wr->ordered = rc == 0 && !behind && !ix->chain_holes && wr->count >= m;
    wr->touch_mod = wr->mod;
    return rc;
}

/* Records blocks [from, m) of the chain under worker slot `wi`, one lookup each (the cap rule
 * below protects all m blocks of the text). */
static int insert_blocks(kvr_prefix_index *ix, uint32_t wi, size_t from, size_t m, size_t cap)
{
    int rc = 0, have_set = 0;
    /* Last block first: each block ends up more recent than everything after it. */
    for (size_t k = m; k-- > from;) {
        if (k >= from + 8)
            prefetch_buckets(ix, fp_of(ix->chain[k - 8]));
        uint64_t fp = fp_of(ix->chain[k]);
        kfind f;
        wrec *w = &ix->w[wi];
        key_find(ix, fp, wi, &f);
        if (f.slot != NIL) {
            lru_unlink(ix, w, f.slot);
            lru_push_head(ix, w, f.slot);
            w->touch[k] = f.slot;
            continue;
        }
        if (f.last_g >= MAX_GROUPS) {
            ix->chain_holes = 1; /* touch[k] names nothing: the blocks are not in order */
            continue; /* 256 workers hold this block already: this one is not recorded */
        }
        /* Make room in the worker's budget first, so holdings never exceed the caps (the table
         * is sized for them). The victim is the least recent block not in this text: one of
         * this text's blocks still waiting to be touched is touched now instead (the loop
         * touches it again in order), never evicted and re-added. Since m <= cap, the worker
         * always holds some block outside the text here. */
        int changed = 0;
        while (w->count >= cap) {
            if (!have_set) {
                if (cset_build(ix, m) < 0) {
                    rc = -1;
                    goto out;
                }
                have_set = 1;
            }
            uint32_t t = w->tail;
            if (cset_has(ix, KW_FP(at(ix, t)->kw))) {
                lru_unlink(ix, w, t);
                lru_push_head(ix, w, t);
            } else {
                evict_one(ix, wi);
                changed = 1;
            }
        }
        /* Evictions compact other keys' groups; look again to be safe about this one's. */
        if (changed)
            key_find(ix, fp, wi, &f);
        int evicted;
        uint32_t s = place_live(ix, KW(fp, f.last_g, wi), &evicted);
        if (s == NIL) {
            rc = -1;
            break;
        }
        if (evicted) {
            /* Holders of this key may have gone while making room: take the holding out,
             * look at the key's groups again and put it where it belongs. */
            unsigned si = s >> LOCAL_BITS;
            at(ix, s)->kw = 0;
            ix->sh[si].used--;
            ix->used--;
            key_find(ix, fp, wi, &f);
            s = place_live(ix, KW(fp, f.last_g, wi), &evicted);
            if (s == NIL) {
                rc = -1;
                break;
            }
        }
        w = &ix->w[wi];
        w->count++;
        if (!f.holders)
            ix->keys++;
        lru_push_head(ix, w, s);
        w->touch[k] = s;
    }
out:
    return rc;
}

/* The match of a text the chain is bound to (kvr_prefix_index_match_kept). */
static void match_bound(kvr_prefix_index *ix, const void *text, size_t len,
                        const size_t *workers, size_t n, size_t *matched)
{
    size_t B = ix->block_bytes, nblocks = (len + B - 1) / B;
    if (n <= BISECT_WORKERS) {
        for (size_t j = 0; j < n; j++) {
            long wi = worker_find(ix, workers[j]);
            if (wi < 0 || !ix->w[wi].count)
                continue;
            size_t h = held_run(ix, (uint32_t)wi, text, len, nblocks);
            if (h == SIZE_MAX)
                return;
            matched[j] = h == nblocks ? len : h * B;
        }
        ix->match_valid = 1;
        return;
    }
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
    const uint32_t *want = ix->want;
    uint64_t fps[MATCH_BATCH];
    const slot *bp1[MATCH_BATCH], *bp2[MATCH_BATCH];
    /* Many workers: one walk serves them all. Hash a batch of blocks ahead and prefetch their
     * two buckets each, so the table's cache misses overlap instead of adding up. */
    for (size_t i = 0; i < nblocks; i += MATCH_BATCH) {
        size_t cnt = nblocks - i < MATCH_BATCH ? nblocks - i : MATCH_BATCH;
        if (chain_hash(ix, text, len, i + cnt) < 0)
            goto done;
        for (size_t k = 0; k < cnt; k++) {
            fps[k] = fp_of(ix->chain[i + k]);
            const shard *sh = &ix->sh[shard_of(fps[k])];
            size_t b1, b2;
            pair_of(sh->nb, fps[k], 0, &b1, &b2);
            bp1[k] = sh->slots + b1 * BUCKET;
            bp2[k] = sh->slots + b2 * BUCKET;
            __builtin_prefetch(bp1[k]);
            __builtin_prefetch(bp2[k]);
        }
        for (size_t k = 0; k < cnt; k++) {
            size_t off = (i + k) * B, bl = len - off < B ? len - off : B, ext = 0;
            uint64_t fp = fps[k];
            const slot *b[2] = {bp1[k], bp2[k]};
            for (unsigned g = 0;;) {
                int c = 0;
                for (int h = 0; h < 2; h++)
                    for (int j = 0; j < BUCKET; j++) {
                        uint64_t kw = b[h][j].kw;
                        if (kw && KW_FP(kw) == fp && KW_G(kw) == g) {
                            c++;
                            uint32_t r = want[KW_W(kw)];
                            if (r && matched[r - 1] == off) {
                                matched[r - 1] = off + bl;
                                ext++;
                            }
                        }
                    }
                if (c < GROUP || ++g >= MAX_GROUPS)
                    break;
                const shard *sh = &ix->sh[shard_of(fp)];
                size_t b1, b2;
                pair_of(sh->nb, fp, g, &b1, &b2);
                b[0] = sh->slots + b1 * BUCKET;
                b[1] = sh->slots + b2 * BUCKET;
            }
            if (!ext)
                goto walked;
        }
    }
walked:
    ix->match_valid = 1;
done:
    for (size_t j = 0; j < n; j++) {
        long wi = worker_find(ix, workers[j]);
        if (wi >= 0)
            ix->want[wi] = 0;
    }
}

void kvr_prefix_index_match_kept(kvr_prefix_index *ix, const void *text, size_t len,
                                 kvr_prefix_keys *kept, const size_t *workers, size_t n,
                                 size_t *matched)
{
    memset(matched, 0, n * sizeof(*matched));
    ix->match_valid = 0;
    if (!len || !n || !ix->used)
        return;
    /* The chain's keys are kept for kvr_prefix_index_match_use(), which then probes only the
     * chosen worker's few LRU run boundaries, and for the insert that usually follows. */
    kept = bind_text(ix, text, len, kept);
    match_bound(ix, text, len, workers, n, matched);
    if (kept)
        kept_save(ix, len, kept);
}

void kvr_prefix_index_match(kvr_prefix_index *ix, const void *text, size_t len,
                            const size_t *workers, size_t n, size_t *matched)
{
    kvr_prefix_index_match_kept(ix, text, len, NULL, workers, n, matched);
}

size_t kvr_prefix_index_forget_worker(kvr_prefix_index *ix, size_t worker)
{
    long wl = worker_find(ix, worker);
    if (wl < 0)
        return 0;
    wrec *w = &ix->w[wl];
    size_t dropped = 0;
    for (uint32_t s = w->head; s != NIL;) {
        /* Compaction in table_remove() only moves other workers' holdings, so the rest of
         * this worker's list stays where it is. */
        uint32_t nx = at(ix, s)->next;
        if (table_remove(ix, s))
            ix->keys--;
        dropped++;
        s = nx;
    }
    ix->forgotten += dropped;
    w->used = 0;
    w->count = 0;
    w->learned = 0;
    w->touch_n = 0;
    w->run_pending = w->ordered = 0;
    w->head = w->tail = NIL;
    ix->ext2int[worker] = 0;
    update_need(ix);
    return dropped;
}

/* 1 and the use stamp of `wi`'s holding of fingerprint `fp` in `*out`, or 0 when it holds
 * none. */
static int stamp_of(const kvr_prefix_index *ix, uint32_t wi, uint64_t fp, uint32_t *out)
{
    kfind f;
    key_find(ix, fp, wi, &f);
    if (f.slot == NIL)
        return 0;
    *out = ix->sh[f.slot >> LOCAL_BITS].st[f.slot & LOCAL_MASK];
    return 1;
}

/* stamp_of() for chain block `block`: one load when the worker's hint names its holding. */
static int stamp_at(const kvr_prefix_index *ix, uint32_t wi, size_t block, uint32_t *out)
{
    const wrec *w = &ix->w[wi];
    uint64_t fp = fp_of(ix->chain[block]);
    uint32_t id = hinted(ix, wi, block, fp);
    if (id != NIL) {
        *out = w->run_pending ? w->run_stamp : ix->sh[id >> LOCAL_BITS].st[id & LOCAL_MASK];
        return 1;
    }
    return stamp_of(ix, wi, fp, out);
}

void kvr_prefix_index_match_use(kvr_prefix_index *ix, size_t worker, size_t matched,
                                kvr_prefix_use *out)
{
    memset(out, 0, sizeof(*out));
    long wl = worker_find(ix, worker);
    size_t m = (matched + ix->block_bytes - 1) / ix->block_bytes;
    if (wl < 0 || !m || !ix->match_valid || m > ix->chain_n || m > UINT32_MAX)
        return;
    uint32_t wi = (uint32_t)wl;
    out->gen = ix->w[wi].gen;
    /* Stamps never increase along the chain (an insert touching a block touches its ancestors
     * in the same call), so each run of equal stamps is found by galloping then bisecting:
     * O(runs × log blocks) probes, 2 for the usual single run. */
    size_t lo = 0;
    uint32_t s_lo;
    if (!stamp_at(ix, wi, 0, &s_lo))
        return;
    while (lo < m) {
        uint32_t s_last;
        size_t r = out->runs;
        while (!stamp_at(ix, wi, m - 1, &s_last))
            m--; /* not held after all (an eviction since the match): the chain ends sooner */
        if (m <= lo)
            break;
        if (s_last == s_lo || r + 1 == KVR_PREFIX_USE_RUNS) {
            /* The last run; when runs ran out, its stamp is the chain's oldest, so a correction
             * inside it drops less, never more. */
            out->end[r] = (uint32_t)m;
            out->stamp[r] = s_last;
            out->runs = (uint32_t)r + 1;
            break;
        }
        /* Last block with stamp s_lo: in [eq, ne), eq holding s_lo, ne not. */
        size_t eq = lo, ne = m - 1, step = 1;
        uint32_t sx;
        while (eq + step < ne) {
            size_t x = eq + step;
            if (!stamp_at(ix, wi, x, &sx) || sx != s_lo) {
                ne = x;
                break;
            }
            eq = x;
            step *= 2;
        }
        while (ne - eq > 1) {
            size_t x = eq + (ne - eq) / 2;
            if (!stamp_at(ix, wi, x, &sx) || sx != s_lo)
                ne = x;
            else
                eq = x;
        }
        out->end[r] = (uint32_t)(eq + 1);
        out->stamp[r] = s_lo;
        out->runs = (uint32_t)r + 1;
        lo = ne;
        if (!stamp_at(ix, wi, lo, &s_lo))
            break; /* a hole in the chain: what follows cannot be vouched for */
    }
}

/* Drops what worker `wl` used no later than `threshold` and lowers its learned capacity to
 * what is left (at least `keep_blocks`, at least 1); returns the holdings dropped. Stamps grow
 * from the tail to the head: what was used no later than the threshold is a tail segment,
 * dropped in O(its length). Holdings touched since have newer stamps and stay, whatever they
 * held then. */
static long drop_used_until(kvr_prefix_index *ix, uint32_t wl, uint32_t threshold,
                            size_t keep_blocks)
{
    wrec *w = &ix->w[wl];
    long dropped = 0;
    w_settle(ix, w);
    while (w->tail != NIL) {
        uint32_t t = w->tail;
        if (!stamp_le(ix->sh[t >> LOCAL_BITS].st[t & LOCAL_MASK], threshold))
            break;
        lru_unlink(ix, w, t);
        w->count--;
        if (table_remove(ix, t))
            ix->keys--;
        dropped++;
    }
    ix->corrected += (uint64_t)dropped;
    size_t floor = w->count > keep_blocks ? w->count : keep_blocks;
    if (!floor)
        floor = 1;
    if (floor < eff_cap(ix, w)) {
        w->learned = floor;
        update_need(ix);
    }
    return dropped;
}

long kvr_prefix_index_correct(kvr_prefix_index *ix, size_t worker, const kvr_prefix_use *use,
                              size_t block, size_t keep_blocks)
{
    long wl = worker_find(ix, worker);
    if (wl < 0 || !use->runs || ix->w[wl].gen != use->gen)
        return -1; /* unknown, or forgotten since the snapshot: its old entries are gone */
    uint32_t r = 0;
    while (r < use->runs && use->end[r] <= block)
        r++;
    if (r == use->runs)
        return -1;
    return drop_used_until(ix, (uint32_t)wl, use->stamp[r], keep_blocks);
}

long kvr_prefix_index_correct_key(kvr_prefix_index *ix, size_t worker, uint64_t key,
                                  size_t keep_blocks)
{
    long wl = worker_find(ix, worker);
    uint32_t threshold;
    if (wl >= 0)
        w_settle(ix, &ix->w[wl]); /* the key may be any holding's */
    if (wl < 0 || !stamp_of(ix, (uint32_t)wl, fp_of(key), &threshold))
        return -1;
    return drop_used_until(ix, (uint32_t)wl, threshold, keep_blocks);
}

void kvr_prefix_index_raise_capacity(kvr_prefix_index *ix, size_t worker, size_t blocks)
{
    long wl = worker_find(ix, worker);
    if (wl < 0 || !ix->w[wl].learned)
        return;
    wrec *w = &ix->w[wl];
    size_t base = base_cap(ix, w);
    if (w->learned >= base || blocks >= base - w->learned)
        w->learned = 0;
    else
        w->learned += blocks;
    update_need(ix);
}

int kvr_prefix_index_set_worker_capacity(kvr_prefix_index *ix, size_t worker, size_t blocks)
{
    long wl = worker_get(ix, worker);
    if (wl < 0)
        return -1;
    ix->w[wl].cap = blocks;
    ix->w[wl].learned = 0; /* a capacity the worker publishes replaces what was learned */
    update_need(ix);
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
    out->corrected = ix->corrected;
    for (unsigned i = 0; i < NSHARDS; i++)
        out->table_slots += ix->sh[i].nb * BUCKET;
    out->memory_bytes = sizeof(*ix) + out->table_slots * (sizeof(slot) + sizeof(uint32_t)) +
                        ix->nw * (sizeof(wrec) + sizeof(uint32_t)) +
                        ix->next_alloc * sizeof(uint32_t) + ix->chain_alloc * sizeof(uint64_t) +
                        ix->cset_alloc * sizeof(uint64_t) + ix->chain_text_alloc;
    for (size_t i = 0; i < ix->nw; i++)
        out->memory_bytes += ix->w[i].touch_alloc * sizeof(uint32_t);
}
