/* Consistent-hash ring: a sorted array of (position, worker slot) points; workers are few and
 * change rarely, so add/remove rebuild the array and lookups binary-search it. */
#include "routing/hashring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "util/xxh.h"

typedef struct point {
    uint64_t pos;
    uint32_t w;          /* index into workers[] */
} point;

typedef struct member {
    size_t id;
    char *url;
    unsigned vnodes;
    int used;
} member;

struct kvr_hashring {
    unsigned vnodes;
    point *pts;
    size_t npts;
    member *m;
    size_t nm;           /* member slots (used or free) */
    size_t nused;
};

kvr_hashring *kvr_hashring_create(unsigned vnodes)
{
    if (!vnodes)
        return NULL;
    kvr_hashring *r = calloc(1, sizeof(*r));
    if (r)
        r->vnodes = vnodes;
    return r;
}

void kvr_hashring_destroy(kvr_hashring *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nm; i++)
        free(r->m[i].url);
    free(r->m);
    free(r->pts);
    free(r);
}

uint64_t kvr_hash_key(const void *key, size_t len)
{
    return XXH3_64bits(key, len);
}

int kvr_hash_route_key(const char *session, size_t session_len, const char *text,
                       size_t text_len, size_t block_bytes, uint64_t *h)
{
    if (session && session_len) {
        *h = kvr_hash_key(session, session_len);
        return 1;
    }
    if (text && text_len) {
        *h = kvr_hash_key(text, block_bytes && text_len > block_bytes ? block_bytes : text_len);
        return 1;
    }
    return 0;
}

uint64_t kvr_rendezvous_score(uint64_t key_hash, const char *url, size_t url_len)
{
    return XXH3_64bits_withSeed(url, url_len, key_hash);
}

double kvr_rendezvous_weighted(uint64_t score, double weight)
{
    /* The top 53 bits, centred in their interval: u is never 0 nor 1, so ln(u) < 0. */
    double u = ((double)(score >> 11) + 0.5) * 0x1p-53;
    return -weight / log(u);
}

static const kvr_hashring *sort_ring; /* qsort has no context argument; single-threaded */

static int point_cmp(const void *a, const void *b)
{
    const point *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    /* Equal positions (~never): order by URL so every router instance agrees. */
    return strcmp(sort_ring->m[x->w].url, sort_ring->m[y->w].url);
}

static long find_member(const kvr_hashring *r, size_t id)
{
    for (size_t i = 0; i < r->nm; i++)
        if (r->m[i].used && r->m[i].id == id)
            return (long)i;
    return -1;
}

int kvr_hashring_has(const kvr_hashring *r, size_t id, const char *url)
{
    long i = find_member(r, id);
    return i >= 0 && strcmp(r->m[i].url, url) == 0;
}

unsigned kvr_hashring_member_vnodes(const kvr_hashring *r, size_t id)
{
    long i = find_member(r, id);
    return i >= 0 ? r->m[i].vnodes : 0;
}

unsigned kvr_hashring_vnodes_for(double weight)
{
    double v = weight * KVR_HASHRING_VNODES + 0.5;
    if (!(v >= 1)) /* also NaN */
        return 1;
    return v >= KVR_HASHRING_MAX_VNODES ? KVR_HASHRING_MAX_VNODES : (unsigned)v;
}

size_t kvr_hashring_workers(const kvr_hashring *r)
{
    return r->nused;
}

int kvr_hashring_remove(kvr_hashring *r, size_t id)
{
    long i = find_member(r, id);
    if (i < 0)
        return 0;
    size_t k = 0;
    for (size_t j = 0; j < r->npts; j++)
        if (r->pts[j].w != (uint32_t)i)
            r->pts[k++] = r->pts[j];
    r->npts = k;
    free(r->m[i].url);
    r->m[i].url = NULL;
    r->m[i].used = 0;
    r->nused--;
    return 1;
}

int kvr_hashring_add(kvr_hashring *r, size_t id, const char *url)
{
    return kvr_hashring_add_vnodes(r, id, url, r->vnodes);
}

int kvr_hashring_add_vnodes(kvr_hashring *r, size_t id, const char *url, unsigned vnodes)
{
    if (!vnodes)
        return -1;
    if (kvr_hashring_has(r, id, url) && kvr_hashring_member_vnodes(r, id) == vnodes)
        return 0;
    kvr_hashring_remove(r, id);
    char *u = strdup(url);
    point *pts = realloc(r->pts, (r->npts + vnodes) * sizeof(*pts));
    if (!u || !pts) {
        free(u);
        if (pts)
            r->pts = pts;
        return -1;
    }
    r->pts = pts;
    size_t slot;
    for (slot = 0; slot < r->nm; slot++)
        if (!r->m[slot].used)
            break;
    if (slot == r->nm) {
        member *m = realloc(r->m, (r->nm + 1) * sizeof(*m));
        if (!m) {
            free(u);
            return -1;
        }
        r->m = m;
        r->nm++;
    }
    r->m[slot] = (member){.id = id, .url = u, .vnodes = vnodes, .used = 1};
    r->nused++;
    size_t len = strlen(url);
    for (unsigned i = 0; i < vnodes; i++)
        r->pts[r->npts++] = (point){.pos = XXH3_64bits_withSeed(url, len, i), .w = (uint32_t)slot};
    sort_ring = r;
    qsort(r->pts, r->npts, sizeof(*r->pts), point_cmp);
    sort_ring = NULL;
    return 0;
}

int kvr_hashring_lookup(const kvr_hashring *r, uint64_t key_hash, kvr_hashring_ok_fn ok,
                        void *ctx, size_t *id)
{
    if (!r->npts)
        return -1;
    /* First point with pos >= key_hash (wrapping to 0). */
    size_t lo = 0, hi = r->npts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->pts[mid].pos < key_hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t start = lo == r->npts ? 0 : lo;
    if (!ok) {
        *id = r->m[r->pts[start].w].id;
        return 0;
    }
    /* Walk clockwise; each distinct worker is asked once, so a long run of one ineligible
     * worker's points costs no extra predicate calls. */
    unsigned char seen_small[64] = {0};
    unsigned char *seen = r->nm <= sizeof(seen_small) ? seen_small : calloc(r->nm, 1);
    if (!seen)
        return -1;
    size_t asked = 0;
    int rc = -1;
    for (size_t k = 0; k < r->npts && asked < r->nused; k++) {
        const point *p = &r->pts[(start + k) % r->npts];
        if (seen[p->w])
            continue;
        seen[p->w] = 1;
        asked++;
        if (ok(ctx, r->m[p->w].id)) {
            *id = r->m[p->w].id;
            rc = 0;
            break;
        }
    }
    if (seen != seen_small)
        free(seen);
    return rc;
}
