/* Round trip: batches written by kvroute-sim's encoder (sim/kvevents.c, both event encodings)
 * read back by kvroute's decoder (src/events/decode.c) give the events that were written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "events/decode.h"
#include "kvevents.h"

/* What one encoded event should decode to. */
typedef struct want {
    kvr_kv_ev_type type;
    uint64_t hashes[4];
    size_t nhashes;
    int has_parent;
    uint64_t parent;
    uint32_t tokens[64];
    size_t ntokens;
    uint32_t block_size;
} want;

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s ^ (*s >> 29);
}

/* A deterministic mix of the three events; values span every msgpack integer width. */
static void make(want *w, uint64_t *seed)
{
    memset(w, 0, sizeof(*w));
    uint64_t r = next(seed);
    w->type = r % 8 == 0 ? KVR_KV_EV_CLEARED : r % 3 == 0 ? KVR_KV_EV_REMOVED : KVR_KV_EV_STORED;
    if (w->type == KVR_KV_EV_CLEARED)
        return;
    w->nhashes = w->type == KVR_KV_EV_REMOVED ? 1 : 1 + next(seed) % 4;
    for (size_t i = 0; i < w->nhashes; i++)
        w->hashes[i] = next(seed) >> (next(seed) % 64);
    if (w->type == KVR_KV_EV_REMOVED)
        return;
    w->has_parent = next(seed) % 2;
    w->parent = w->has_parent ? next(seed) | 1 : 0;
    w->block_size = 1 + (uint32_t)(next(seed) % 16);
    w->ntokens = w->nhashes * w->block_size;
    for (size_t i = 0; i < w->ntokens; i++)
        w->tokens[i] = (uint32_t)(next(seed) >> (next(seed) % 64));
}

static void add(kvr_sim_evbatch *b, const want *w)
{
    int rc = w->type == KVR_KV_EV_CLEARED   ? kvr_sim_evbatch_cleared(b)
             : w->type == KVR_KV_EV_REMOVED ? kvr_sim_evbatch_removed(b, w->hashes[0])
                                            : kvr_sim_evbatch_stored(b, w->hashes, w->nhashes,
                                                                     w->has_parent, w->parent,
                                                                     w->tokens, w->ntokens,
                                                                     w->block_size);
    assert_int_equal(rc, 0);
}

static void check(const kvr_kv_event *e, const want *w)
{
    assert_int_equal(e->type, w->type);
    assert_int_equal(e->medium, KVR_KV_GPU);
    assert_int_equal(e->nhashes, w->nhashes);
    for (size_t i = 0; i < w->nhashes; i++)
        assert_true(e->hashes[i] == w->hashes[i]);
    assert_int_equal(e->has_parent, w->has_parent);
    if (w->has_parent)
        assert_true(e->parent == w->parent);
    assert_int_equal(e->ntokens, w->ntokens);
    for (size_t i = 0; i < w->ntokens; i++)
        assert_int_equal(e->tokens[i], w->tokens[i]);
    assert_int_equal(e->block_size, w->block_size);
    assert_int_equal(e->group_idx, w->type == KVR_KV_EV_CLEARED ? -1 : 0);
}

static void round_trip(int map, size_t nevents, int dp_rank, uint64_t seed)
{
    want *ws = calloc(nevents ? nevents : 1, sizeof(*ws));
    assert_non_null(ws);
    kvr_sim_evbatch b;
    kvr_sim_evbatch_init(&b, map, 0);
    uint64_t s = seed;
    for (size_t i = 0; i < nevents; i++) {
        make(&ws[i], &s);
        add(&b, &ws[i]);
    }
    kvr_buf out;
    kvr_buf_init(&out, 0);
    assert_int_equal(kvr_sim_evbatch_finish(&b, 1750000000.25, dp_rank, &out), 0);
    char err[128];
    kvr_kv_batch *d = kvr_kv_decode(out.data, out.len, err, sizeof(err));
    if (!d)
        fail_msg("map=%d n=%zu: %s", map, nevents, err);
    assert_true(d->ts == 1750000000.25);
    assert_int_equal(d->dp_rank, dp_rank);
    assert_int_equal(d->unknown, 0);
    assert_int_equal(d->nevents, nevents);
    for (size_t i = 0; i < nevents; i++)
        check(&d->events[i], &ws[i]);
    kvr_kv_batch_free(d);
    kvr_buf_free(&out);
    kvr_sim_evbatch_free(&b);
    free(ws);
}

static void test_round_trip_array(void **state)
{
    (void)state;
    round_trip(0, 0, 0, 1);
    round_trip(0, 1, 3, 2);
    round_trip(0, 300, 0, 3); /* past 15 and 255: array16 headers */
}

static void test_round_trip_map(void **state)
{
    (void)state;
    round_trip(1, 0, 1, 4);
    round_trip(1, 1, 0, 5);
    round_trip(1, 300, 7, 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_array),
        cmocka_unit_test(test_round_trip_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
