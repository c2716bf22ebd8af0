/* Session map: entries in a slab with stable indexes (free list, one LRU list ordered by last
 * use), found through a linear-probing table of slab indexes. Nothing points into the table,
 * so deletion can shift entries back (no tombstones) and growth just re-inserts indexes. */
#include "index/session_map.h"

#include <stdlib.h>
#include <string.h>
#include "util/xxh.h"

#include "util/rand.h"

#define NIL UINT32_MAX
#define EMPTY UINT32_MAX

typedef struct entry {
    uint64_t h1, h2;     /* XXH3-128 of the key */
    uint64_t last_ms;    /* last successful use */
    uint32_t worker;     /* NIL marks a free slab entry */
    uint32_t prev;       /* towards the most recent */
    uint32_t next;       /* towards the least recent; free-list link when free */
} entry;

struct kvr_session_map {
    uint64_t ttl_ms;
    size_t capacity;
    uint64_t seed;
    entry *e;
    size_t ne;           /* slab entries allocated */
    uint32_t free_head;
    uint32_t head, tail; /* most / least recently used */
    size_t count;
    uint32_t *tab;       /* slab indexes; EMPTY = free slot */
    size_t tmask;        /* table size - 1 (power of two, >= 2 × entries) */
    uint64_t evictions[KVR_SESSION_EVICT_NREASONS];
    size_t *wcount;      /* entries per worker id */
    size_t nwcount;
};

const char *kvr_session_evict_reason_name(kvr_session_evict_reason r)
{
    switch (r) {
    case KVR_SESSION_EVICT_TTL:
        return "ttl";
    case KVR_SESSION_EVICT_CAPACITY:
        return "capacity";
    case KVR_SESSION_EVICT_WORKER_REMOVED:
        return "worker_removed";
    default:
        return "unknown";
    }
}

kvr_session_map *kvr_session_map_create(uint64_t ttl_ms, size_t capacity)
{
    if (!capacity || capacity >= NIL)
        return NULL;
    kvr_session_map *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->ttl_ms = ttl_ms;
    m->capacity = capacity;
    m->seed = kvr_rand_u64();
    m->free_head = m->head = m->tail = NIL;
    m->tmask = 15;
    m->tab = malloc((m->tmask + 1) * sizeof(*m->tab));
    if (!m->tab) {
        free(m);
        return NULL;
    }
    memset(m->tab, 0xff, (m->tmask + 1) * sizeof(*m->tab));
    return m;
}

void kvr_session_map_destroy(kvr_session_map *m)
{
    if (!m)
        return;
    free(m->e);
    free(m->tab);
    free(m->wcount);
    free(m);
}

static void digest(const kvr_session_map *m, const void *key, size_t len, uint64_t *h1,
                   uint64_t *h2)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(key, len, m->seed);
    *h1 = h.low64;
    *h2 = h.high64;
}

/* Table position of the entry with this digest, or of the empty slot that ends its probe. */
static size_t tab_find(const kvr_session_map *m, uint64_t h1, uint64_t h2)
{
    size_t i = h1 & m->tmask;
    for (;;) {
        uint32_t x = m->tab[i];
        if (x == EMPTY || (m->e[x].h1 == h1 && m->e[x].h2 == h2))
            return i;
        i = (i + 1) & m->tmask;
    }
}

/* Linear-probing deletion by backward shift (Knuth 6.4 algorithm R): keeps every probe chain
 * unbroken without tombstones. */
static void tab_delete(kvr_session_map *m, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & m->tmask;
        uint32_t x = m->tab[j];
        if (x == EMPTY)
            break;
        size_t k = m->e[x].h1 & m->tmask;
        /* Move x back to i unless its home k lies cyclically in (i, j]. */
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            m->tab[i] = x;
            i = j;
        }
    }
    m->tab[i] = EMPTY;
}

static int tab_grow(kvr_session_map *m)
{
    size_t n = (m->tmask + 1) * 2;
    uint32_t *t = malloc(n * sizeof(*t));
    if (!t)
        return -1;
    memset(t, 0xff, n * sizeof(*t));
    for (size_t i = 0; i <= m->tmask; i++) {
        uint32_t x = m->tab[i];
        if (x == EMPTY)
            continue;
        size_t p = m->e[x].h1 & (n - 1);
        while (t[p] != EMPTY)
            p = (p + 1) & (n - 1);
        t[p] = x;
    }
    free(m->tab);
    m->tab = t;
    m->tmask = n - 1;
    return 0;
}

static void lru_unlink(kvr_session_map *m, uint32_t x)
{
    entry *e = &m->e[x];
    if (e->prev != NIL)
        m->e[e->prev].next = e->next;
    else
        m->head = e->next;
    if (e->next != NIL)
        m->e[e->next].prev = e->prev;
    else
        m->tail = e->prev;
}

static void lru_push_head(kvr_session_map *m, uint32_t x)
{
    entry *e = &m->e[x];
    e->prev = NIL;
    e->next = m->head;
    if (m->head != NIL)
        m->e[m->head].prev = x;
    else
        m->tail = x;
    m->head = x;
}

static void wcount_add(kvr_session_map *m, uint32_t worker, int d)
{
    if (worker < m->nwcount)
        m->wcount[worker] += (size_t)(ptrdiff_t)d;
}

static int wcount_reserve(kvr_session_map *m, size_t worker)
{
    if (worker < m->nwcount)
        return 0;
    size_t n = m->nwcount ? m->nwcount : 16;
    while (n <= worker)
        n *= 2;
    size_t *p = realloc(m->wcount, n * sizeof(*p));
    if (!p)
        return -1;
    memset(p + m->nwcount, 0, (n - m->nwcount) * sizeof(*p));
    m->wcount = p;
    m->nwcount = n;
    return 0;
}

/* Removes entry x (at table position ti) and returns it to the free list. */
static void drop(kvr_session_map *m, uint32_t x, size_t ti, kvr_session_evict_reason why,
                 int count_it)
{
    tab_delete(m, ti);
    lru_unlink(m, x);
    wcount_add(m, m->e[x].worker, -1);
    m->e[x].worker = NIL;
    m->e[x].next = m->free_head;
    m->free_head = x;
    m->count--;
    if (count_it)
        m->evictions[why]++;
}

static void drop_entry(kvr_session_map *m, uint32_t x, kvr_session_evict_reason why)
{
    drop(m, x, tab_find(m, m->e[x].h1, m->e[x].h2), why, 1);
}

static int expired(const kvr_session_map *m, const entry *e, uint64_t now_ms)
{
    return m->ttl_ms && now_ms > e->last_ms && now_ms - e->last_ms > m->ttl_ms;
}

int kvr_session_map_get(kvr_session_map *m, const void *key, size_t len, uint64_t now_ms,
                        size_t *worker)
{
    if (!len || !m->count)
        return 0;
    uint64_t h1, h2;
    digest(m, key, len, &h1, &h2);
    size_t ti = tab_find(m, h1, h2);
    uint32_t x = m->tab[ti];
    if (x == EMPTY)
        return 0;
    if (expired(m, &m->e[x], now_ms)) {
        drop(m, x, ti, KVR_SESSION_EVICT_TTL, 1);
        return 0;
    }
    *worker = m->e[x].worker;
    return 1;
}

int kvr_session_map_bind(kvr_session_map *m, const void *key, size_t len, size_t worker,
                         uint64_t now_ms)
{
    if (!len || worker >= KVR_SESSION_MAP_MAX_WORKER_ID)
        return -1;
    if (wcount_reserve(m, worker) < 0)
        return -1;
    uint64_t h1, h2;
    digest(m, key, len, &h1, &h2);
    size_t ti = tab_find(m, h1, h2);
    uint32_t x = m->tab[ti];
    if (x != EMPTY) {
        entry *e = &m->e[x];
        wcount_add(m, e->worker, -1);
        e->worker = (uint32_t)worker;
        wcount_add(m, e->worker, 1);
        e->last_ms = now_ms;
        lru_unlink(m, x);
        lru_push_head(m, x);
        return 0;
    }
    /* New key: expired entries go before live ones are evicted for room. */
    kvr_session_map_sweep(m, now_ms, 2);
    if (m->count >= m->capacity)
        drop_entry(m, m->tail, KVR_SESSION_EVICT_CAPACITY);
    if (m->free_head == NIL) {
        size_t n = m->ne ? m->ne * 2 : 16;
        if (n > m->capacity)
            n = m->capacity;
        if (n <= m->ne)
            return -1; /* unreachable: count < capacity means a free entry exists */
        entry *ne = realloc(m->e, n * sizeof(*ne));
        if (!ne)
            return -1;
        m->e = ne;
        for (size_t i = n; i-- > m->ne;) {
            ne[i].worker = NIL;
            ne[i].next = m->free_head;
            m->free_head = (uint32_t)i;
        }
        m->ne = n;
    }
    /* Keep the table at most half full so probes stay short. */
    if ((m->count + 1) * 2 > m->tmask + 1 && tab_grow(m) < 0)
        return -1;
    ti = tab_find(m, h1, h2);
    x = m->free_head;
    m->free_head = m->e[x].next;
    entry *e = &m->e[x];
    e->h1 = h1;
    e->h2 = h2;
    e->last_ms = now_ms;
    e->worker = (uint32_t)worker;
    m->tab[ti] = x;
    lru_push_head(m, x);
    wcount_add(m, e->worker, 1);
    m->count++;
    return 0;
}

int kvr_session_map_remove(kvr_session_map *m, const void *key, size_t len)
{
    if (!len || !m->count)
        return 0;
    uint64_t h1, h2;
    digest(m, key, len, &h1, &h2);
    size_t ti = tab_find(m, h1, h2);
    uint32_t x = m->tab[ti];
    if (x == EMPTY)
        return 0;
    drop(m, x, ti, KVR_SESSION_EVICT_TTL, 0);
    return 1;
}

size_t kvr_session_map_forget_worker(kvr_session_map *m, size_t worker)
{
    if (worker >= m->nwcount || !m->wcount[worker])
        return 0;
    size_t n = 0;
    for (size_t x = 0; x < m->ne && m->wcount[worker]; x++) {
        if (m->e[x].worker == worker) {
            drop_entry(m, (uint32_t)x, KVR_SESSION_EVICT_WORKER_REMOVED);
            n++;
        }
    }
    return n;
}

size_t kvr_session_map_sweep(kvr_session_map *m, uint64_t now_ms, size_t max)
{
    /* The LRU list is ordered by last use (times are monotonic), so the expired entries are
     * exactly a run at its tail. */
    size_t n = 0;
    while (n < max && m->tail != NIL && expired(m, &m->e[m->tail], now_ms)) {
        drop_entry(m, m->tail, KVR_SESSION_EVICT_TTL);
        n++;
    }
    return n;
}

size_t kvr_session_map_worker_count(const kvr_session_map *m, size_t worker)
{
    return worker < m->nwcount ? m->wcount[worker] : 0;
}

void kvr_session_map_stats_get(const kvr_session_map *m, kvr_session_map_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->sessions = m->count;
    memcpy(out->evictions, m->evictions, sizeof(out->evictions));
    out->memory_bytes = sizeof(*m) + m->ne * sizeof(entry) + (m->tmask + 1) * sizeof(uint32_t) +
                        m->nwcount * sizeof(size_t);
}
