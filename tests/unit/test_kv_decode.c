/* vLLM KV-event batch decoder: the reference's worked example (vllm-kv-events.md §1.5) byte
 * for byte in both event encodings, BlockRemoved and AllBlocksCleared, bin and negative
 * hashes, map batches, an absent rank, legacy short events, unknown tags and keys, and
 * malformed payloads (each NULL with a reason). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "events/decode.h"

#define H0 0x1e0b2e028ef071cbull
#define H1 0xefad121d154ab2d6ull
#define LIT(s) s, sizeof(s) - 1

/* §1.5 array form, 80 bytes. */
static const unsigned char g_stored_array[] = {
    0x93, 0xcb, 0x41, 0xda, 0x13, 0xb8, 0x60, 0x20, 0x00, 0x00,        /* [ts 1750000000.5 */
    0x91, 0x9b,                                                        /* [[ (11 elements) */
    0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',       /* tag */
    0x92, 0xcf, 0x1e, 0x0b, 0x2e, 0x02, 0x8e, 0xf0, 0x71, 0xcb,        /* [h0, */
    0xcf, 0xef, 0xad, 0x12, 0x1d, 0x15, 0x4a, 0xb2, 0xd6,              /*  h1] */
    0xc0,                                                              /* parent nil */
    0x98, 1, 2, 3, 4, 5, 6, 7, 8,                                      /* token_ids */
    0x04, 0xc0, 0xa3, 'G', 'P', 'U', 0xc0,                             /* bs, lora, medium… */
    0x92, 0xc0, 0xc0, 0x00,                                            /* extra_keys, group */
    0xae, 'f', 'u', 'l', 'l', '_', 'a', 't', 't', 'e', 'n', 't', 'i', 'o', 'n',
    0x00};                                                             /* rank 0] */

#define TS "\x93\xcb\x41\xda\x13\xb8\x60\x20\x00\x00"
#define HASHES2 "\x92\xcf\x1e\x0b\x2e\x02\x8e\xf0\x71\xcb\xcf\xef\xad\x12\x1d\x15\x4a\xb2\xd6"

/* §1.5 map form, 202 bytes. */
static const char g_stored_map[] =
    TS "\x91\x8b"
    "\xa4" "type" "\xab" "BlockStored"
    "\xac" "block_hashes" HASHES2
    "\xb1" "parent_block_hash" "\xc0"
    "\xa9" "token_ids" "\x98\x01\x02\x03\x04\x05\x06\x07\x08"
    "\xaa" "block_size" "\x04"
    "\xa7" "lora_id" "\xc0"
    "\xa6" "medium" "\xa3" "GPU"
    "\xa9" "lora_name" "\xc0"
    "\xaa" "extra_keys" "\x92\xc0\xc0"
    "\xa9" "group_idx" "\x00"
    "\xb2" "kv_cache_spec_kind" "\xae" "full_attention"
    "\x00";

/* One-event batches with ts 0 and rank 0, for the small cases. */
#define B1 "\x93\x00\x91"
#define STORED "\xab" "BlockStored"

static kvr_kv_batch *dec(const void *p, size_t n, char *err)
{
    return kvr_kv_decode(p, n, err, 128);
}

static void check_worked_example(const kvr_kv_batch *b)
{
    assert_non_null(b);
    assert_true(b->ts == 1750000000.5);
    assert_int_equal(b->dp_rank, 0);
    assert_int_equal(b->nevents, 1);
    assert_int_equal(b->unknown, 0);
    const kvr_kv_event *e = &b->events[0];
    assert_int_equal(e->type, KVR_KV_EV_STORED);
    assert_int_equal(e->medium, KVR_KV_GPU);
    assert_int_equal(e->nhashes, 2);
    assert_true(e->hashes[0] == H0 && e->hashes[1] == H1);
    assert_int_equal(e->has_parent, 0);
    assert_int_equal(e->ntokens, 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(e->tokens[i], i + 1);
    assert_int_equal(e->block_size, 4);
    assert_int_equal(e->group_idx, 0);
}

static void test_worked_example_array(void **state)
{
    (void)state;
    char err[128];
    assert_int_equal(sizeof(g_stored_array), 80);
    kvr_kv_batch *b = dec(g_stored_array, sizeof(g_stored_array), err);
    check_worked_example(b);
    kvr_kv_batch_free(b);
    /* every cut short of the whole is truncated */
    for (size_t n = 0; n < sizeof(g_stored_array); n++) {
        err[0] = '\0';
        assert_null(dec(g_stored_array, n, err));
        assert_true(err[0] != '\0');
    }
}

static void test_worked_example_map(void **state)
{
    (void)state;
    char err[128];
    assert_int_equal(sizeof(g_stored_map) - 1, 202);
    kvr_kv_batch *b = dec(LIT(g_stored_map), err);
    check_worked_example(b);
    kvr_kv_batch_free(b);
}

static void test_removed_and_cleared(void **state)
{
    (void)state;
    char err[128];
    static const char removed[] = TS "\x91\x94\xac" "BlockRemoved"
                                  "\x91\xcf\xef\xad\x12\x1d\x15\x4a\xb2\xd6" "\xa3" "GPU" "\x00\x00";
    kvr_kv_batch *b = dec(LIT(removed), err);
    assert_non_null(b);
    assert_int_equal(b->nevents, 1);
    assert_int_equal(b->events[0].type, KVR_KV_EV_REMOVED);
    assert_int_equal(b->events[0].nhashes, 1);
    assert_true(b->events[0].hashes[0] == H1);
    assert_null(b->events[0].tokens);
    assert_int_equal(b->events[0].group_idx, 0);
    kvr_kv_batch_free(b);

    static const char removed_map[] = B1 "\x83\xa4" "type" "\xac" "BlockRemoved"
                                      "\xa6" "medium" "\xa3" "cpu"
                                      "\xac" "block_hashes" "\x92\x07\x08" "\x00";
    b = dec(LIT(removed_map), err);
    assert_non_null(b);
    assert_int_equal(b->events[0].medium, KVR_KV_CPU);
    assert_int_equal(b->events[0].nhashes, 2);
    assert_int_equal(b->events[0].hashes[1], 8);
    assert_int_equal(b->events[0].group_idx, -1);
    kvr_kv_batch_free(b);

    static const char cleared[] = TS "\x91\x91\xb0" "AllBlocksCleared" "\x00";
    static const char cleared_map[] = TS "\x91\x81\xa4" "type" "\xb0" "AllBlocksCleared" "\x00";
    const char *forms[] = {cleared, cleared_map};
    size_t lens[] = {sizeof(cleared) - 1, sizeof(cleared_map) - 1};
    for (int i = 0; i < 2; i++) {
        b = dec(forms[i], lens[i], err);
        assert_non_null(b);
        assert_int_equal(b->nevents, 1);
        const kvr_kv_event *e = &b->events[0];
        assert_int_equal(e->type, KVR_KV_EV_CLEARED);
        assert_true(!e->hashes && !e->nhashes && !e->tokens && !e->ntokens && !e->has_parent);
        assert_int_equal(e->medium, KVR_KV_GPU);
        assert_int_equal(e->group_idx, -1);
        kvr_kv_batch_free(b);
    }
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_bin(msgpack_packer *pk, const unsigned char *p, size_t n)
{
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, p, n);
}

static void test_bin_hashes(void **state)
{
    (void)state;
    unsigned char d32[32], d16[16], zero[32] = {0};
    static const unsigned char d4[4] = {0xde, 0xad, 0xbe, 0xef};
    for (int i = 0; i < 32; i++)
        d32[i] = (unsigned char)i;
    for (int i = 0; i < 16; i++)
        d16[i] = (unsigned char)(0xa0 + i);
    for (int zero_parent = 0; zero_parent <= 1; zero_parent++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 3);
        msgpack_pack_double(&pk, 1.0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, 5);
        pack_str(&pk, "BlockStored");
        msgpack_pack_array(&pk, 3);
        pack_bin(&pk, d32, 32);
        pack_bin(&pk, d16, 16);
        pack_bin(&pk, d4, 4);
        pack_bin(&pk, zero_parent ? zero : d16, zero_parent ? 32 : 16);
        msgpack_pack_array(&pk, 0);
        msgpack_pack_uint8(&pk, 16);
        msgpack_pack_int(&pk, 1);
        char err[128];
        kvr_kv_batch *b = dec(sb.data, sb.size, err);
        msgpack_sbuffer_destroy(&sb);
        assert_non_null(b);
        const kvr_kv_event *e = &b->events[0];
        assert_int_equal(e->nhashes, 3);
        assert_true(e->hashes[0] == 0x18191a1b1c1d1e1full);
        assert_true(e->hashes[1] == 0xa8a9aaabacadaeafull);
        assert_true(e->hashes[2] == 0xdeadbeefull);
        assert_int_equal(e->has_parent, !zero_parent);
        if (!zero_parent)
            assert_true(e->parent == 0xa8a9aaabacadaeafull);
        assert_null(e->tokens); /* an empty token array */
        assert_int_equal(b->dp_rank, 1);
        kvr_kv_batch_free(b);
    }
}

static void test_negative_hash_and_zero_parent(void **state)
{
    (void)state;
    char err[128];
    /* hashes [-1, -2^63], parent 0 (none), then one with parent -3 */
    static const char p[] = "\x93\x00\x92"
                            "\x95" STORED "\x92\xff\xd3\x80\x00\x00\x00\x00\x00\x00\x00"
                            "\x00" "\x90" "\x10"
                            "\x95" STORED "\x91\x05" "\xfd" "\x90" "\x10" "\x00";
    kvr_kv_batch *b = dec(LIT(p), err);
    assert_non_null(b);
    assert_int_equal(b->nevents, 2);
    assert_true(b->events[0].hashes[0] == UINT64_MAX);
    assert_true(b->events[0].hashes[1] == 0x8000000000000000ull);
    assert_int_equal(b->events[0].has_parent, 0);
    assert_int_equal(b->events[1].has_parent, 1);
    assert_true(b->events[1].parent == UINT64_MAX - 2);
    /* the two events' hashes sit side by side in the batch's one hash array */
    assert_ptr_equal(b->events[1].hashes, b->events[0].hashes + 2);
    kvr_kv_batch_free(b);
}

static void test_map_batch(void **state)
{
    (void)state;
    char err[128];
    static const char p[] = "\x84"
                            "\xa5" "extra" "\x81\x01\x02"
                            "\xa6" "events" "\x91\x91\xb0" "AllBlocksCleared"
                            "\xb2" "data_parallel_rank" "\x03"
                            "\xa2" "ts" "\xca\x3f\xc0\x00\x00"; /* float32 1.5 */
    kvr_kv_batch *b = dec(LIT(p), err);
    assert_non_null(b);
    assert_true(b->ts == 1.5);
    assert_int_equal(b->dp_rank, 3);
    assert_int_equal(b->nevents, 1);
    kvr_kv_batch_free(b);
    static const char no_rank[] = "\x82\xa2" "ts" "\x2a" "\xa6" "events" "\x90";
    b = dec(LIT(no_rank), err);
    assert_non_null(b);
    assert_true(b->ts == 42.0);
    assert_int_equal(b->dp_rank, -1);
    assert_int_equal(b->nevents, 0);
    assert_null(b->events);
    kvr_kv_batch_free(b);
    static const char no_events[] = "\x81\xa2" "ts" "\x2a";
    assert_null(dec(LIT(no_events), err));
    assert_non_null(strstr(err, "events"));
}

static void test_rank_absent_and_extras(void **state)
{
    (void)state;
    char err[128];
    static const char absent[] = "\x92\x00\x90";
    static const char nil[] = "\x93\x00\x90\xc0";
    static const char extra[] = "\x95\x00\x90\x07\xa1" "x" "\xc0";
    kvr_kv_batch *b = dec(LIT(absent), err);
    assert_non_null(b);
    assert_int_equal(b->dp_rank, -1);
    kvr_kv_batch_free(b);
    b = dec(LIT(nil), err);
    assert_non_null(b);
    assert_int_equal(b->dp_rank, -1);
    kvr_kv_batch_free(b);
    b = dec(LIT(extra), err);
    assert_non_null(b);
    assert_int_equal(b->dp_rank, 7);
    kvr_kv_batch_free(b);
}

static void test_legacy_short_stored(void **state)
{
    (void)state;
    char err[128];
    /* tag + 5 (old vLLM: no medium), tag + 4, then tag + 3 which lacks block_size */
    static const char p5[] = B1 "\x96" STORED "\x91\x01" "\xc0" "\x92\x0a\x0b" "\x02" "\xc0" "\x00";
    static const char p4[] = B1 "\x95" STORED "\x91\x01" "\x02" "\x92\x0a\x0b" "\x02" "\x00";
    static const char p3[] = B1 "\x94" STORED "\x91\x01" "\xc0" "\x92\x0a\x0b" "\x00";
    kvr_kv_batch *b = dec(LIT(p5), err);
    assert_non_null(b);
    const kvr_kv_event *e = &b->events[0];
    assert_int_equal(e->medium, KVR_KV_GPU);
    assert_int_equal(e->group_idx, -1);
    assert_int_equal(e->block_size, 2);
    assert_int_equal(e->ntokens, 2);
    assert_int_equal(e->tokens[1], 11);
    kvr_kv_batch_free(b);
    b = dec(LIT(p4), err);
    assert_non_null(b);
    assert_int_equal(b->events[0].has_parent, 1);
    assert_true(b->events[0].parent == 2);
    kvr_kv_batch_free(b);
    assert_null(dec(LIT(p3), err));
    assert_non_null(strstr(err, "event 0: BlockStored array has 4 elements"));
}

static void test_unknown_tags_and_keys(void **state)
{
    (void)state;
    char err[128];
    static const char p[] =
        "\x93\x00\x95"
        "\x93\xaa" "BlockMoved" "\x01\xa1" "x"      /* unknown, array form */
        "\x82\xa4" "type" "\xa3" "New" "\x01\x02"   /* unknown, map form */
        "\x91\xa7" "BlockSt"                          /* a tag's prefix is unknown too */
        /* stored, 13 elements: medium "DISK", group 5, then two elements past the schema */
        "\x9d" STORED "\x91\x01" "\xc0" "\x90" "\x10" "\x01" "\xa4" "DISK" "\xa1" "a" "\x90"
        "\x05" "\xae" "full_attention" "\x10" "\x81\xc0\xc0"
        /* stored map with unknown keys (one not a string) and medium "Gpu" */
        "\x85\xa4" "type" STORED "\xaa" "cache_salt" "\x81\x01\x92\xc0\xc0"
        "\x2a\xc3" "\xa6" "medium" "\xa3" "Gpu" "\xac" "block_hashes" "\x91\x09"
        "\x00";
    kvr_kv_batch *b = dec(LIT(p), err);
    assert_non_null(b);
    assert_int_equal(b->unknown, 3);
    assert_int_equal(b->nevents, 2);
    assert_int_equal(b->events[0].medium, KVR_KV_CPU);
    assert_int_equal(b->events[0].group_idx, 5);
    assert_int_equal(b->events[0].block_size, 16);
    assert_int_equal(b->events[1].medium, KVR_KV_GPU);
    assert_true(b->events[1].hashes[0] == 9);
    assert_int_equal(b->events[1].block_size, 0);
    kvr_kv_batch_free(b);
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *p;
        size_t n;
        const char *why;
    } cases[] = {
        {LIT("\xc1"), "not msgpack"},
        {LIT("{\"ts\": 1, \"events\": []}"), "trailing bytes"},
        {LIT("\x92\x00\x90\x00"), "trailing bytes"},
        {LIT("\x93\x00\x91"), "truncated"},
        {LIT("\xdd\xff\xff\xff\xff"), "truncated"}, /* declares 4 G elements in 5 bytes */
        /* without the pre-pass, msgpack-c asks for 8 GiB on these 7 bytes (fuzz corpus file
         * refused_array32_declares_268M_elements) */
        {LIT("\x93\x00\xdd\x10\x00\x00\x00"), "truncated"},
        {LIT("\xdf\x7f\xff\xff\xff\xc0"), "truncated"},
        {LIT("\xc6\xff\xff\xff\xff\x00"), "truncated"},
        {LIT("\xa5" "batch"), "batch is not an array or map"},
        {LIT("\x91\x00"), "batch array has 1 elements"},
        {LIT("\x93\xa1" "t" "\x90\x00"), "ts is not a number"},
        {LIT("\x93\x00\x80\x00"), "events is not an array"},
        {LIT("\x93\x00\x90\xa1" "0"), "data_parallel_rank is not an integer"},
        {LIT("\x93\x00\x90\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), "data_parallel_rank out of range"},
        {LIT(B1 "\x07\x00"), "event 0: event is not an array or map"},
        {LIT(B1 "\x90\x00"), "event 0: empty event array"},
        {LIT(B1 "\x91\x07\x00"), "event 0: event tag is not a string"},
        {LIT(B1 "\x81\xa1" "t" "\x01\x00"), "event 0: event map without \"type\""},
        {LIT(B1 "\x95" STORED "\x05\xc0\x90\x04\x00"), "block_hashes is not an array"},
        {LIT(B1 "\x95" STORED "\x91\xa1" "h" "\xc0\x90\x04\x00"), "a block hash is not an integer"},
        {LIT(B1 "\x95" STORED "\x90\xc3\x90\x04\x00"), "parent_block_hash is not an integer"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x05\x04\x00"), "token_ids is not an array"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x91\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x04\x00"),
         "event 0: a token id out of range"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x91\xff\x04\x00"), "a token id out of range"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x91\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00"),
         "a token id is not an integer"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x90\xa1" "4" "\x00"), "block_size is not an integer"},
        {LIT(B1 "\x95" STORED "\x90\xc0\x90\xcf\x00\x00\x00\x01\x00\x00\x00\x00\x00"),
         "block_size out of range"},
        {LIT(B1 "\x97" STORED "\x90\xc0\x90\x04\xc0\x07\x00"), "medium is not a string"},
        {LIT(B1 "\x9a" STORED "\x90\xc0\x90\x04\xc0\xc0\xc0\xc0\xa1" "g" "\x00"),
         "group_idx is not an integer"},
        {LIT(B1 "\x81\xa4" "type" "\xac" "BlockRemoved" "\x00"), "BlockRemoved without block_hashes"},
        {LIT(B1 "\x91\xac" "BlockRemoved" "\x00"), "BlockRemoved array has 1 elements"},
        {LIT(B1 "\x81\xa4" "type" "\x01\x00"), "event tag is not a string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[128] = "unset";
        kvr_kv_batch *b = kvr_kv_decode(cases[i].p, cases[i].n, err, sizeof(err));
        if (b || !strstr(err, cases[i].why))
            fail_msg("case %zu: want \"%s\", got %s \"%s\"", i, cases[i].why,
                     b ? "a batch" : "NULL", err);
    }
}

static void test_limits(void **state)
{
    (void)state;
    char err[128];
    /* nesting past msgpack-c's 32-level stack */
    char deep[41];
    memset(deep, 0x91, 40);
    deep[40] = (char)0xc0;
    assert_null(dec(deep, sizeof(deep), err));
    assert_non_null(strstr(err, "nested deeper"));
    /* the size cap comes before any byte is read */
    size_t big = ((size_t)64 << 20) + 1;
    char *p = calloc(1, big);
    assert_non_null(p);
    assert_null(dec(p, big, err));
    assert_non_null(strstr(err, "over 64 MiB"));
    free(p);
    assert_null(dec("", 0, err));
    assert_string_equal(err, "empty payload");
}

static void test_err_buffer(void **state)
{
    (void)state;
    static const char p[] = B1 "\x95" STORED "\x90\xc0\x90\xa1" "4" "\x00";
    char err[8];
    memset(err, 'x', sizeof(err));
    assert_null(kvr_kv_decode(LIT(p), err, sizeof(err)));
    assert_string_equal(err, "event 0");
    assert_null(kvr_kv_decode(LIT(p), NULL, 0));
    err[0] = 'x';
    assert_null(kvr_kv_decode(LIT(p), err, 0));
    assert_int_equal(err[0], 'x');
    kvr_kv_batch_free(NULL);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(kvr_kv_ev_type_name(KVR_KV_EV_STORED), "BlockStored");
    assert_string_equal(kvr_kv_ev_type_name(KVR_KV_EV_REMOVED), "BlockRemoved");
    assert_string_equal(kvr_kv_ev_type_name(KVR_KV_EV_CLEARED), "AllBlocksCleared");
    assert_string_equal(kvr_kv_medium_name(KVR_KV_GPU), "GPU");
    assert_string_equal(kvr_kv_medium_name(KVR_KV_CPU), "CPU");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example_array),
        cmocka_unit_test(test_worked_example_map),
        cmocka_unit_test(test_removed_and_cleared),
        cmocka_unit_test(test_bin_hashes),
        cmocka_unit_test(test_negative_hash_and_zero_parent),
        cmocka_unit_test(test_map_batch),
        cmocka_unit_test(test_rank_absent_and_extras),
        cmocka_unit_test(test_legacy_short_stored),
        cmocka_unit_test(test_unknown_tags_and_keys),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_err_buffer),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
