/* Routing-log entries and Redis URLs (cluster/entry.c): an entry encoded into a frame reads
 * back as the same fields and decodes to the same entry; every required field, bound and
 * number is checked on decode; unknown fields are ignored and other versions skipped; the
 * session digest is stable (replicas must agree on it); URLs parse with their defaults,
 * credentials and db, and rediss:// says TLS is missing. Also the prefix index's insert by
 * block keys: the same keys as the text make the same matches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/entry.h"
#include "index/prefix_index.h"

static size_t frame_fields(const kvr_buf *b, const char **argv, size_t *lens)
{
    size_t off = 0;
    size_t n = kvr_entry_frame_next(b->data, b->len, &off, argv, lens);
    assert_int_equal(off, b->len);
    return n;
}

static void test_roundtrip(void **st)
{
    (void)st;
    unsigned char keys[3 * 8];
    for (size_t i = 0; i < sizeof(keys); i++)
        keys[i] = (unsigned char)(i * 37 + 1);
    kvr_entry e = {.type = KVR_ENTRY_TEACH, .replica = "r1", .replica_len = 2, .route = "m",
                   .route_len = 1, .worker = "http://w1", .worker_len = 9, .ts_ms = 1234567,
                   .block_bytes = 64, .keys = keys, .nkeys = 3, .has_session = 1,
                   .ttl_s = 3600};
    kvr_entry_session_digest("sess", 4, e.session);
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_entry_encode(&e, 100, &b), 0);
    const char *argv[KVR_ENTRY_MAX_FIELDS];
    size_t lens[KVR_ENTRY_MAX_FIELDS];
    size_t n = frame_fields(&b, argv, lens);
    assert_int_equal(n, 20);
    kvr_entry d;
    assert_int_equal(kvr_entry_decode(argv, lens, n, &d), 0);
    assert_int_equal(d.type, KVR_ENTRY_TEACH);
    assert_int_equal(d.ts_ms, 1234567);
    assert_int_equal(d.block_bytes, 64);
    assert_int_equal(d.nkeys, 3);
    assert_memory_equal(d.keys, keys, sizeof(keys));
    uint64_t k0 = 0;
    for (int i = 7; i >= 0; i--)
        k0 = k0 << 8 | keys[i];
    assert_int_equal(kvr_entry_key(&d, 0), k0);
    assert_true(d.has_session);
    assert_int_equal(d.ttl_s, 3600);
    assert_memory_equal(d.session, e.session, 16);
    assert_int_equal(d.worker_len, 9);
    assert_memory_equal(d.worker, "http://w1", 9);
    assert_memory_equal(d.route, "m", 1);
    assert_memory_equal(d.replica, "r1", 2);

    /* max_keys cuts the keys */
    kvr_buf_reset(&b);
    assert_int_equal(kvr_entry_encode(&e, 2, &b), 0);
    n = frame_fields(&b, argv, lens);
    assert_int_equal(kvr_entry_decode(argv, lens, n, &d), 0);
    assert_int_equal(d.nkeys, 2);

    /* forget: no route, keys or session */
    kvr_entry f = {.type = KVR_ENTRY_FORGET, .replica = "r1", .replica_len = 2,
                   .worker = "w", .worker_len = 1, .ts_ms = 5};
    kvr_buf_reset(&b);
    assert_int_equal(kvr_entry_encode(&f, 100, &b), 0);
    n = frame_fields(&b, argv, lens);
    assert_int_equal(kvr_entry_decode(argv, lens, n, &d), 0);
    assert_int_equal(d.type, KVR_ENTRY_FORGET);
    assert_int_equal(d.nkeys, 0);
    assert_false(d.has_session);

    /* correct: one key and the cap's floor */
    kvr_entry cx = {.type = KVR_ENTRY_CORRECT, .replica = "r1", .replica_len = 2, .route = "m",
                    .route_len = 1, .worker = "w", .worker_len = 1, .ts_ms = 9,
                    .block_bytes = 64, .keys = keys, .nkeys = 3, .keep_blocks = 42};
    kvr_buf_reset(&b);
    assert_int_equal(kvr_entry_encode(&cx, 100, &b), 0);
    n = frame_fields(&b, argv, lens);
    assert_int_equal(kvr_entry_decode(argv, lens, n, &d), 0);
    assert_int_equal(d.type, KVR_ENTRY_CORRECT);
    assert_int_equal(d.nkeys, 1);
    assert_int_equal(d.keep_blocks, 42);
    assert_int_equal(kvr_entry_key(&d, 0), k0);
    cx.block_bytes = 0;
    assert_int_equal(kvr_entry_encode(&cx, 100, &b), -1);

    /* an empty worker name is refused, the buffer left as it was */
    size_t len = b.len;
    f.worker_len = 0;
    assert_int_equal(kvr_entry_encode(&f, 100, &b), -1);
    assert_int_equal(b.len, len);
    kvr_buf_free(&b);
}

static int dec(const char *const *kv, size_t n, kvr_entry *e)
{
    size_t lens[32];
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(kv[i]);
    return kvr_entry_decode(kv, lens, n, e);
}

static void test_decode_rules(void **st)
{
    (void)st;
    kvr_entry e;
    const char *ok[] = {"v", "1", "t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7",
                        "future", "ignored"};
    assert_int_equal(dec(ok, 14, &e), 0);
    const char *v2[] = {"v", "2", "t", "whatever"};
    assert_int_equal(dec(v2, 4, &e), 1);
    const char *other[] = {"v", "1", "t", "expire", "r", "a", "w", "w", "ts", "1"};
    assert_int_equal(dec(other, 10, &e), 1);
    const char *nov[] = {"t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7"};
    assert_int_equal(dec(nov, 10, &e), -1);
    const char *noroute[] = {"v", "1", "t", "teach", "r", "a", "w", "w", "ts", "7"};
    assert_int_equal(dec(noroute, 10, &e), -1);
    const char *nots[] = {"v", "1", "t", "forget", "r", "a", "w", "w"};
    assert_int_equal(dec(nots, 8, &e), -1);
    const char *badts[] = {"v", "1", "t", "forget", "r", "a", "w", "w", "ts", "-1"};
    assert_int_equal(dec(badts, 10, &e), -1);
    const char *bigts[] = {"v", "1", "t", "forget", "r", "a", "w", "w", "ts",
                           "99999999999999999999"};
    assert_int_equal(dec(bigts, 10, &e), -1);
    const char *badkeys[] = {"v", "1", "t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7",
                             "bb", "64", "b", "1234567"};
    assert_int_equal(dec(badkeys, 16, &e), -1);
    const char *nobb[] = {"v", "1", "t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7",
                          "b", "12345678"};
    assert_int_equal(dec(nobb, 14, &e), -1);
    const char *badsess[] = {"v", "1", "t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7",
                             "s", "xyz"};
    assert_int_equal(dec(badsess, 14, &e), -1);
    const char *bigttl[] = {"v", "1", "t", "teach", "r", "a", "m", "m", "w", "w", "ts", "7",
                            "s", "00112233445566778899aabbccddeeff", "ttl", "99999999999"};
    assert_int_equal(dec(bigttl, 16, &e), -1);
    const char *odd[] = {"v", "1", "t"};
    assert_int_equal(dec(odd, 3, &e), -1);
    char longname[300];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    const char *toolong[] = {"v", "1", "t", "forget", "r", longname, "w", "w", "ts", "1"};
    assert_int_equal(dec(toolong, 10, &e), -1);
}

static void test_session_digest_is_stable(void **st)
{
    (void)st;
    unsigned char a[16], b[16], c[16];
    kvr_entry_session_digest("session-1", 9, a);
    kvr_entry_session_digest("session-1", 9, b);
    kvr_entry_session_digest("session-12", 10, c);
    assert_memory_equal(a, b, 16);
    assert_memory_not_equal(a, c, 16);
}

static void test_urls(void **st)
{
    (void)st;
    kvr_redis_url u;
    char err[300];
    assert_int_equal(kvr_redis_url_parse("redis://127.0.0.1", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.password, "");
    assert_int_equal(kvr_redis_url_parse("redis://us%3Ar:p%40ss@h:7000/3", &u, err, sizeof(err)),
                     0);
    assert_string_equal(u.user, "us:r");
    assert_string_equal(u.password, "p@ss");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.port, 7000);
    assert_int_equal(u.db, 3);
    assert_int_equal(kvr_redis_url_parse("redis://:secret@[::1]:6380/", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "secret");
    assert_int_equal(u.port, 6380);
    assert_int_equal(kvr_redis_url_parse("rediss://h:1", &u, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "TLS"));
    const char *bad[] = {"http://h", "redis://", "redis://h:0", "redis://h:70000",
                         "redis://h:1/x", "redis://h/70000", "redis://a:%zz@h", "redis://h x",
                         "redis://[::1", "redis://h:1x", NULL};
    for (int i = 0; bad[i]; i++)
        assert_int_equal(kvr_redis_url_parse(bad[i], &u, err, sizeof(err)), -1);
    assert_int_equal(kvr_redis_url_parse(NULL, &u, err, sizeof(err)), -1);
}

static void test_insert_keys_matches_like_text(void **st)
{
    (void)st;
    kvr_prefix_index_cfg cfg = {.block_bytes = 16, .max_blocks = 1000};
    kvr_prefix_index *a = kvr_prefix_index_create(&cfg), *b = kvr_prefix_index_create(&cfg);
    const char *text = "0123456789abcdef0123456789ABCDEF tail";
    size_t len = strlen(text);
    uint64_t keys[8];
    size_t n = kvr_prefix_index_block_keys(16, text, len, keys, 8);
    assert_int_equal(n, 3);
    assert_int_equal(kvr_prefix_index_insert(a, 2, text, len), 0);
    assert_int_equal(kvr_prefix_index_insert_keys(b, 2, keys, n), 0);
    size_t ids[2] = {1, 2}, ma[2], mb[2];
    kvr_prefix_index_match(a, text, len, ids, 2, ma);
    kvr_prefix_index_match(b, text, len, ids, 2, mb);
    assert_int_equal(ma[1], len);
    assert_int_equal(mb[1], len);
    assert_int_equal(mb[0], 0);
    /* a longer text shares the two full blocks only */
    const char *more = "0123456789abcdef0123456789ABCDEF tail and more";
    kvr_prefix_index_match(b, more, strlen(more), ids, 2, mb);
    assert_int_equal(mb[1], 32);
    assert_int_equal(kvr_prefix_index_insert_keys(b, 2, keys, 0), 0);
    kvr_prefix_index_destroy(a);
    kvr_prefix_index_destroy(b);
}

/* A remote correction drops, on this index, what the worker used no later than the block
 * found missing (by this index's own stamps), and lowers its cap, never below the floor. */
static void test_correct_key(void **st)
{
    (void)st;
    kvr_prefix_index_cfg cfg = {.block_bytes = 8, .max_blocks = 1000};
    kvr_prefix_index *ix = kvr_prefix_index_create(&cfg);
    const char *old = "old-old-old-old-", *mid = "mid-mid-mid-mid-", *new = "new-new-new-new-";
    kvr_prefix_index_insert(ix, 1, old, 16);
    kvr_prefix_index_insert(ix, 1, mid, 16);
    kvr_prefix_index_insert(ix, 1, new, 16);
    kvr_prefix_index_insert(ix, 2, mid, 16);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 1), 6);
    uint64_t keys[2];
    kvr_prefix_index_block_keys(8, mid, 16, keys, 2);
    /* worker 1 lacks mid's second block: old and mid go, new stays; cap floor 2 */
    assert_int_equal(kvr_prefix_index_correct_key(ix, 1, keys[1], 2), 4);
    assert_int_equal(kvr_prefix_index_worker_blocks(ix, 1), 2);
    assert_int_equal(kvr_prefix_index_worker_capacity(ix, 1), 2);
    size_t ids[2] = {1, 2}, m[2];
    kvr_prefix_index_match(ix, new, 16, ids, 2, m);
    assert_int_equal(m[0], 16);
    kvr_prefix_index_match(ix, mid, 16, ids, 2, m);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 16); /* another worker's holdings are untouched */
    /* a key the worker does not hold changes nothing */
    assert_int_equal(kvr_prefix_index_correct_key(ix, 1, keys[1], 2), -1);
    assert_int_equal(kvr_prefix_index_correct_key(ix, 7, keys[1], 2), -1);
    kvr_prefix_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_decode_rules),
        cmocka_unit_test(test_session_digest_is_stable),
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_insert_keys_matches_like_text),
        cmocka_unit_test(test_correct_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
