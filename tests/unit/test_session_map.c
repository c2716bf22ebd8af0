/* Session map: exact-key identity, TTL (lazy and swept), capacity LRU, worker removal, and a
 * randomized comparison with a brute-force model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "index/session_map.h"
#include "util/rand.h"

static int get(kvr_session_map *m, const char *k, uint64_t now, size_t *w)
{
    return kvr_session_map_get(m, k, strlen(k), now, w);
}

static void bind(kvr_session_map *m, const char *k, size_t w, uint64_t now)
{
    assert_int_equal(kvr_session_map_bind(m, k, strlen(k), w, now), 0);
}

static void test_exact_keys(void **state)
{
    (void)state;
    kvr_session_map *m = kvr_session_map_create(0, 100);
    bind(m, "session-1", 1, 0);
    bind(m, "session-12", 2, 0);
    size_t w = 99;
    assert_int_equal(get(m, "session-1", 0, &w), 1);
    assert_int_equal(w, 1);
    assert_int_equal(get(m, "session-12", 0, &w), 1);
    assert_int_equal(w, 2);
    assert_int_equal(get(m, "session-", 0, &w), 0);
    assert_int_equal(get(m, "session-123", 0, &w), 0);
    /* Binary keys with NUL bytes are keys like any other. */
    assert_int_equal(kvr_session_map_bind(m, "a\0b", 3, 4, 0), 0);
    assert_int_equal(kvr_session_map_get(m, "a\0c", 3, 0, &w), 0);
    assert_int_equal(kvr_session_map_get(m, "a\0b", 3, 0, &w), 1);
    assert_int_equal(w, 4);
    /* Rebinding moves the session. */
    bind(m, "session-1", 7, 5);
    assert_int_equal(get(m, "session-1", 5, &w), 1);
    assert_int_equal(w, 7);
    assert_int_equal(kvr_session_map_worker_count(m, 1), 0);
    assert_int_equal(kvr_session_map_worker_count(m, 7), 1);
    /* Worker ids are the registry's small indexes: a wild one is refused, not allocated for. */
    assert_int_equal(kvr_session_map_bind(m, "k", 1, KVR_SESSION_MAP_MAX_WORKER_ID, 0), -1);
    /* Empty keys are not sessions. */
    assert_int_equal(kvr_session_map_bind(m, "", 0, 1, 0), -1);
    assert_int_equal(kvr_session_map_get(m, "", 0, 0, &w), 0);
    assert_int_equal(kvr_session_map_remove(m, "session-12", 10), 1);
    assert_int_equal(get(m, "session-12", 5, &w), 0);
    kvr_session_map_stats st;
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.sessions, 2);
    kvr_session_map_destroy(m);
}

static void test_ttl(void **state)
{
    (void)state;
    kvr_session_map *m = kvr_session_map_create(1000, 100);
    size_t w;
    bind(m, "a", 1, 0);
    assert_int_equal(get(m, "a", 1000, &w), 1);   /* idle exactly the TTL: still alive */
    assert_int_equal(get(m, "a", 1001, &w), 0);   /* past it: gone, on lookup */
    kvr_session_map_stats st;
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.sessions, 0);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_TTL], 1);
    /* Looking up does not refresh (only a successful answer does); binding does. */
    bind(m, "b", 1, 0);
    assert_int_equal(get(m, "b", 900, &w), 1);
    assert_int_equal(get(m, "b", 1500, &w), 0);
    bind(m, "c", 1, 0);
    bind(m, "c", 1, 900);
    assert_int_equal(get(m, "c", 1500, &w), 1);
    /* Sweeping drops expired entries oldest first, at most `max` per call. */
    kvr_session_map_destroy(m);
    m = kvr_session_map_create(1000, 1000);
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof(k), "s%d", i);
        bind(m, k, (size_t)i % 3, (uint64_t)i);
    }
    assert_int_equal(kvr_session_map_sweep(m, 1050, 10), 10);
    assert_int_equal(kvr_session_map_sweep(m, 1050, 1000), 40); /* last use < 50 expired */
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.sessions, 50);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_TTL], 50);
    assert_int_equal(get(m, "s50", 1050, &w), 1);
    assert_int_equal(get(m, "s49", 1050, &w), 0);
    /* TTL 0 = never expires. */
    kvr_session_map_destroy(m);
    m = kvr_session_map_create(0, 10);
    bind(m, "x", 1, 0);
    assert_int_equal(get(m, "x", UINT64_MAX / 2, &w), 1);
    kvr_session_map_destroy(m);
}

static void test_capacity_lru(void **state)
{
    (void)state;
    kvr_session_map *m = kvr_session_map_create(0, 3);
    size_t w;
    bind(m, "a", 1, 1);
    bind(m, "b", 1, 2);
    bind(m, "c", 1, 3);
    bind(m, "a", 2, 4);       /* a is now the most recent */
    bind(m, "d", 1, 5);       /* full: b, the least recently used, goes */
    assert_int_equal(get(m, "b", 5, &w), 0);
    assert_int_equal(get(m, "a", 5, &w), 1);
    assert_int_equal(get(m, "c", 5, &w), 1);
    assert_int_equal(get(m, "d", 5, &w), 1);
    kvr_session_map_stats st;
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.sessions, 3);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_CAPACITY], 1);
    assert_string_equal(kvr_session_evict_reason_name(KVR_SESSION_EVICT_CAPACITY), "capacity");
    assert_string_equal(kvr_session_evict_reason_name(KVR_SESSION_EVICT_TTL), "ttl");
    assert_string_equal(kvr_session_evict_reason_name(KVR_SESSION_EVICT_WORKER_REMOVED),
                        "worker_removed");
    kvr_session_map_destroy(m);
    /* Expired entries make room before live ones are evicted. */
    m = kvr_session_map_create(100, 2);
    bind(m, "old", 1, 0);
    bind(m, "live", 1, 150);
    bind(m, "new", 1, 200);
    assert_int_equal(get(m, "live", 200, &w), 1);
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_TTL], 1);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_CAPACITY], 0);
    kvr_session_map_destroy(m);
}

static void test_forget_worker(void **state)
{
    (void)state;
    kvr_session_map *m = kvr_session_map_create(0, 1000);
    for (int i = 0; i < 300; i++) {
        char k[16];
        snprintf(k, sizeof(k), "s%d", i);
        bind(m, k, (size_t)i % 3, 0);
    }
    assert_int_equal(kvr_session_map_worker_count(m, 1), 100);
    assert_int_equal(kvr_session_map_forget_worker(m, 1), 100);
    assert_int_equal(kvr_session_map_worker_count(m, 1), 0);
    for (int i = 0; i < 300; i++) {
        char k[16];
        size_t w = 99;
        snprintf(k, sizeof(k), "s%d", i);
        assert_int_equal(get(m, k, 0, &w), i % 3 != 1);
        if (i % 3 != 1)
            assert_int_equal(w, (size_t)i % 3);
    }
    kvr_session_map_stats st;
    kvr_session_map_stats_get(m, &st);
    assert_int_equal(st.sessions, 200);
    assert_int_equal(st.evictions[KVR_SESSION_EVICT_WORKER_REMOVED], 100);
    assert_int_equal(kvr_session_map_forget_worker(m, 1), 0);
    assert_int_equal(kvr_session_map_forget_worker(m, 12345), 0);
    kvr_session_map_destroy(m);
}

/* Brute-force model: arrays of (key id, worker, last use, recency stamp). */
static void test_random_vs_model(void **state)
{
    (void)state;
    enum { KEYS = 3000, CAP = 500, OPS = 60000, TTL = 5000 };
    static int present[KEYS];
    static size_t worker[KEYS];
    static uint64_t last[KEYS], stamp[KEYS];
    kvr_rand_seed(3);
    kvr_session_map *m = kvr_session_map_create(TTL, CAP);
    uint64_t now = 0, clock = 0;
    size_t live = 0;
    for (int op = 0; op < OPS; op++) {
        now += kvr_rand_below(3);
        size_t k = kvr_rand_below(KEYS);
        char key[16];
        snprintf(key, sizeof(key), "k%zu", k);
        uint64_t r = kvr_rand_below(10);
        if (r < 5) {
            size_t w;
            int got = get(m, key, now, &w);
            int want = present[k] && now - last[k] <= TTL;
            if (present[k] && !want) {
                present[k] = 0;
                live--;
            }
            assert_int_equal(got, want);
            if (want)
                assert_int_equal(w, worker[k]);
        } else if (r < 9) {
            size_t w = kvr_rand_below(6);
            bind(m, key, w, now);
            if (!present[k]) {
                /* The map first sweeps up to 2 expired entries, then evicts the LRU at cap. */
                for (int s = 0; s < 2; s++) {
                    size_t old = KEYS;
                    for (size_t i = 0; i < KEYS; i++)
                        if (present[i] && (old == KEYS || stamp[i] < stamp[old]))
                            old = i;
                    if (old == KEYS || now - last[old] <= TTL)
                        break;
                    present[old] = 0;
                    live--;
                }
                if (live == CAP) {
                    size_t old = KEYS;
                    for (size_t i = 0; i < KEYS; i++)
                        if (present[i] && (old == KEYS || stamp[i] < stamp[old]))
                            old = i;
                    present[old] = 0;
                    live--;
                }
                live++;
            }
            present[k] = 1;
            worker[k] = w;
            last[k] = now;
            stamp[k] = ++clock;
        } else {
            size_t w = kvr_rand_below(6);
            kvr_session_map_forget_worker(m, w);
            for (size_t i = 0; i < KEYS; i++)
                if (present[i] && worker[i] == w) {
                    present[i] = 0;
                    live--;
                }
        }
        kvr_session_map_stats st;
        kvr_session_map_stats_get(m, &st);
        assert_int_equal(st.sessions, live);
        assert_true(st.sessions <= CAP);
    }
    kvr_session_map_destroy(m);
}

static void test_response_pin_map(void **state)
{
    (void)state;
    /* The Responses API pin map is a session map keyed by response id. */
    kvr_session_map *pins = kvr_session_map_create(3600 * 1000, 1000);
    const char *id = "resp_68a1b2c3d4e5f6";
    assert_int_equal(kvr_session_map_bind(pins, id, strlen(id), 2, 10), 0);
    size_t w;
    assert_int_equal(kvr_session_map_get(pins, id, strlen(id), 20, &w), 1);
    assert_int_equal(w, 2);
    kvr_session_map_destroy(pins);
    assert_null(kvr_session_map_create(10, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_keys),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_capacity_lru),
        cmocka_unit_test(test_forget_worker),
        cmocka_unit_test(test_random_vs_model),
        cmocka_unit_test(test_response_pin_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
