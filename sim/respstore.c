/* Ring of stored Responses-API conversations, indexed by the counter inside the id. */
#include "respstore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "resp_"
#define PREFIX_LEN 5
#define DIGEST_LEN 16

typedef struct slot {
    uint64_t counter; /* valid when ids != NULL */
    uint32_t *ids;
    size_t n;
    char *json;       /* the response object, or NULL */
} slot;

struct kvr_sim_resp_store {
    slot *slots;
    size_t cap, count;
    uint64_t next, seed;
};

kvr_sim_resp_store *kvr_sim_resp_store_new(size_t max_entries, uint64_t seed)
{
    kvr_sim_resp_store *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->cap = max_entries;
    st->seed = seed;
    if (max_entries && !(st->slots = calloc(max_entries, sizeof(slot)))) {
        free(st);
        return NULL;
    }
    return st;
}

void kvr_sim_resp_store_salt(kvr_sim_resp_store *st, uint64_t salt)
{
    st->seed ^= salt * 0x9e3779b97f4a7c15ull;
}

void kvr_sim_resp_store_free(kvr_sim_resp_store *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->cap; i++) {
        free(st->slots[i].ids);
        free(st->slots[i].json);
    }
    free(st->slots);
    free(st);
}

static uint64_t digest(uint64_t seed, uint64_t counter)
{
    uint64_t z = seed + counter * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void format_id(const kvr_sim_resp_store *st, uint64_t counter,
                      char id[KVR_SIM_RESP_ID_MAX])
{
    snprintf(id, KVR_SIM_RESP_ID_MAX, PREFIX "%016llx%08llx",
             (unsigned long long)digest(st->seed ^ 0x7265737030ull, counter),
             (unsigned long long)counter);
}

uint64_t kvr_sim_resp_store_next_id(kvr_sim_resp_store *st, char id[KVR_SIM_RESP_ID_MAX])
{
    uint64_t c = ++st->next;
    format_id(st, c, id);
    return c;
}

void kvr_sim_resp_store_put(kvr_sim_resp_store *st, uint64_t counter, uint32_t *ids, size_t n,
                            char *json)
{
    /* Responses finish out of creation order; one whose slot already went to a newer response
     * is past the window and dropped, as it would have been had it finished in order. */
    slot *s = st->cap ? &st->slots[counter % st->cap] : NULL;
    if (!s || counter + st->cap <= st->next || (s->ids && s->counter > counter)) {
        free(ids);
        free(json);
        return;
    }
    if (s->ids) {
        free(s->ids);
        free(s->json);
    } else {
        st->count++;
    }
    *s = (slot){counter, ids, n, json};
}

/* The counter encoded in a well-formed id, or 0 (never issued). */
static uint64_t parse_counter(const char *id)
{
    size_t len = strlen(id);
    if (len < PREFIX_LEN + DIGEST_LEN + 8 || len >= KVR_SIM_RESP_ID_MAX ||
        strncmp(id, PREFIX, PREFIX_LEN) != 0)
        return 0;
    uint64_t c = 0;
    for (const char *p = id + PREFIX_LEN + DIGEST_LEN; *p; p++) {
        int v = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (v < 0 || c >> 60)
            return 0;
        c = c << 4 | (uint64_t)v;
    }
    return c;
}

/* The slot holding `id`, or NULL. */
static slot *find(const kvr_sim_resp_store *st, const char *id)
{
    uint64_t c = parse_counter(id);
    if (!c || !st->cap)
        return NULL;
    slot *s = &st->slots[c % st->cap];
    char want[KVR_SIM_RESP_ID_MAX];
    format_id(st, c, want);
    if (!s->ids || s->counter != c || strcmp(want, id) != 0)
        return NULL;
    return s;
}

const uint32_t *kvr_sim_resp_store_get(const kvr_sim_resp_store *st, const char *id, size_t *n)
{
    const slot *s = find(st, id);
    if (!s)
        return NULL;
    *n = s->n;
    return s->ids;
}

const char *kvr_sim_resp_store_get_json(const kvr_sim_resp_store *st, const char *id)
{
    const slot *s = find(st, id);
    return s ? s->json : NULL;
}

int kvr_sim_resp_store_delete(kvr_sim_resp_store *st, const char *id)
{
    slot *s = find(st, id);
    if (!s)
        return 0;
    free(s->ids);
    free(s->json);
    *s = (slot){0};
    st->count--;
    return 1;
}

size_t kvr_sim_resp_store_count(const kvr_sim_resp_store *st)
{
    return st->count;
}
