/* kvroute-sim Responses-API store: id format, lookups of unknown or forged ids, the bound
 * (oldest dropped first, also when responses finish out of order). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "respstore.h"

static uint32_t *conv(uint32_t first, size_t n)
{
    uint32_t *ids = malloc(n * sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = first + (uint32_t)i;
    return ids;
}

static void test_ids_and_lookup(void **state)
{
    (void)state;
    kvr_sim_resp_store *st = kvr_sim_resp_store_new(8, 42);
    char a[KVR_SIM_RESP_ID_MAX], b[KVR_SIM_RESP_ID_MAX];
    uint64_t ca = kvr_sim_resp_store_next_id(st, a);
    uint64_t cb = kvr_sim_resp_store_next_id(st, b);
    assert_int_equal(strlen(a), 5 + 16 + 8);
    assert_memory_equal(a, "resp_", 5);
    assert_string_not_equal(a, b);
    size_t n = 0;
    assert_null(kvr_sim_resp_store_get(st, a, &n)); /* not stored yet */
    kvr_sim_resp_store_put(st, ca, conv(10, 3), 3, NULL);
    const uint32_t *got = kvr_sim_resp_store_get(st, a, &n);
    assert_non_null(got);
    assert_int_equal(n, 3);
    assert_int_equal(got[2], 12);
    assert_null(kvr_sim_resp_store_get(st, b, &n));
    /* forged: the right counter with another digest, bad hex, wrong prefix, too short/long */
    char forged[KVR_SIM_RESP_ID_MAX];
    memcpy(forged, a, sizeof(forged));
    forged[6] = forged[6] == '0' ? '1' : '0';
    const char *bad[] = {forged,
                         "resp_",
                         "resp_zzzzzzzzzzzzzzzzzzzzzzzz",
                         "resq_000000000000000000000001",
                         "resp_0000000000000000000001",
                         "resp_00000000000000000000000000000000000000000000000001",
                         ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        assert_null(kvr_sim_resp_store_get(st, bad[i], &n));
    kvr_sim_resp_store_put(st, cb, conv(0, 1), 1, NULL);
    assert_int_equal(kvr_sim_resp_store_count(st), 2);
    kvr_sim_resp_store_free(st);
}

static void test_oldest_dropped(void **state)
{
    (void)state;
    kvr_sim_resp_store *st = kvr_sim_resp_store_new(2, 0);
    char id[3][KVR_SIM_RESP_ID_MAX];
    uint64_t c[3];
    for (int i = 0; i < 3; i++)
        c[i] = kvr_sim_resp_store_next_id(st, id[i]);
    size_t n;
    /* finishing out of order: 2 takes the slot 0 would have had; 0 finishing later is too old */
    kvr_sim_resp_store_put(st, c[2], conv(2, 1), 1, NULL);
    kvr_sim_resp_store_put(st, c[0], conv(0, 1), 1, NULL);
    kvr_sim_resp_store_put(st, c[1], conv(1, 1), 1, NULL);
    assert_null(kvr_sim_resp_store_get(st, id[0], &n));
    assert_non_null(kvr_sim_resp_store_get(st, id[1], &n));
    assert_non_null(kvr_sim_resp_store_get(st, id[2], &n));
    assert_int_equal(kvr_sim_resp_store_count(st), 2);
    /* a newer one replaces the oldest */
    char d[KVR_SIM_RESP_ID_MAX];
    kvr_sim_resp_store_put(st, kvr_sim_resp_store_next_id(st, d), conv(3, 2), 2, NULL);
    assert_null(kvr_sim_resp_store_get(st, id[1], &n));
    assert_int_equal(kvr_sim_resp_store_get(st, d, &n)[1], 4);
    assert_int_equal(kvr_sim_resp_store_count(st), 2);
    kvr_sim_resp_store_free(st);
}

static void test_zero_capacity_keeps_nothing(void **state)
{
    (void)state;
    kvr_sim_resp_store *st = kvr_sim_resp_store_new(0, 0);
    char id[KVR_SIM_RESP_ID_MAX];
    size_t n;
    kvr_sim_resp_store_put(st, kvr_sim_resp_store_next_id(st, id), conv(0, 4), 4, NULL);
    assert_null(kvr_sim_resp_store_get(st, id, &n));
    assert_int_equal(kvr_sim_resp_store_count(st), 0);
    kvr_sim_resp_store_free(st);
    kvr_sim_resp_store_free(NULL);
}

/* GET /v1/responses/{id} reads the stored object; DELETE forgets the whole response, so a
 * follow-up naming it as previous_response_id finds nothing either. */
static void test_json_and_delete(void **state)
{
    (void)state;
    kvr_sim_resp_store *st = kvr_sim_resp_store_new(4, 7);
    char a[KVR_SIM_RESP_ID_MAX], b[KVR_SIM_RESP_ID_MAX];
    uint64_t ca = kvr_sim_resp_store_next_id(st, a), cb = kvr_sim_resp_store_next_id(st, b);
    kvr_sim_resp_store_put(st, ca, conv(1, 2), 2, strdup("{\"id\":\"a\"}"));
    kvr_sim_resp_store_put(st, cb, conv(1, 2), 2, NULL);
    assert_string_equal(kvr_sim_resp_store_get_json(st, a), "{\"id\":\"a\"}");
    assert_null(kvr_sim_resp_store_get_json(st, b)); /* stored without an object */
    assert_int_equal(kvr_sim_resp_store_delete(st, a), 1);
    size_t n;
    assert_null(kvr_sim_resp_store_get(st, a, &n));
    assert_null(kvr_sim_resp_store_get_json(st, a));
    assert_int_equal(kvr_sim_resp_store_delete(st, a), 0);
    assert_int_equal(kvr_sim_resp_store_delete(st, "resp_nope"), 0);
    assert_int_equal(kvr_sim_resp_store_count(st), 1);
    /* a response too old to keep frees its object at once (ASan would see a leak) */
    char c[KVR_SIM_RESP_ID_MAX];
    for (int i = 0; i < 4; i++)
        kvr_sim_resp_store_next_id(st, c);
    kvr_sim_resp_store_put(st, cb - 1, conv(0, 1), 1, strdup("{}"));
    kvr_sim_resp_store_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_and_lookup),
        cmocka_unit_test(test_oldest_dropped),
        cmocka_unit_test(test_zero_capacity_keeps_nothing),
        cmocka_unit_test(test_json_and_delete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
