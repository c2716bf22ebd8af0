/* kvroute-sim KV events: byte-exact encodings against the worked example of
 * ../shared/reference/vllm-kv-events.md §1.5, and the ZMQ publisher + replay over ipc://. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvevents.h"

static const uint64_t H0 = 0x1e0b2e028ef071cbull, H1 = 0xefad121d154ab2d6ull;
static const uint32_t TOKENS[8] = {1, 2, 3, 4, 5, 6, 7, 8};

typedef struct bytes {
    unsigned char b[512];
    size_t n;
} bytes;

static void put(bytes *o, const void *p, size_t n)
{
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void put1(bytes *o, unsigned c)
{
    o->b[o->n++] = (unsigned char)c;
}
static void str(bytes *o, const char *s)
{
    put1(o, 0xa0 | (unsigned)strlen(s));
    put(o, s, strlen(s));
}
static void u64(bytes *o, uint64_t v)
{
    put1(o, 0xcf);
    for (int i = 7; i >= 0; i--)
        put1(o, (unsigned)(v >> (8 * i)) & 0xff);
}
static void head(bytes *o)
{
    static const unsigned char ts[] = {0x93, 0xcb, 0x41, 0xda, 0x13, 0xb8, 0x60, 0x20, 0x00, 0x00};
    put(o, ts, sizeof(ts)); /* [1750000000.5, … */
}

static void finish(kvr_sim_evbatch *b, kvr_buf *out)
{
    kvr_buf_init(out, 0);
    assert_int_equal(kvr_sim_evbatch_finish(b, 1750000000.5, 0, out), 0);
}

static void test_block_stored_array_bytes(void **state)
{
    (void)state;
    bytes e = {.n = 0};
    head(&e);
    put1(&e, 0x91);
    put1(&e, 0x9b);
    str(&e, "BlockStored");
    put1(&e, 0x92);
    u64(&e, H0);
    u64(&e, H1);
    put1(&e, 0xc0);
    put1(&e, 0x98);
    for (unsigned i = 1; i <= 8; i++)
        put1(&e, i);
    put1(&e, 0x04);
    put1(&e, 0xc0);
    str(&e, "GPU");
    put1(&e, 0xc0);
    put(&e, "\x92\xc0\xc0", 3);
    put1(&e, 0x00);
    str(&e, "full_attention");
    put1(&e, 0x00);
    assert_int_equal(e.n, 80); /* the reference's size */

    kvr_sim_evbatch b;
    kvr_sim_evbatch_init(&b, 0, 0);
    uint64_t h[2] = {H0, H1};
    assert_int_equal(kvr_sim_evbatch_stored(&b, h, 2, 0, 0, TOKENS, 8, 4), 0);
    kvr_buf out;
    finish(&b, &out);
    assert_int_equal(out.len, e.n);
    assert_memory_equal(out.data, e.b, e.n);
    kvr_buf_free(&out);
    kvr_sim_evbatch_free(&b);
}

static void test_block_stored_map_bytes(void **state)
{
    (void)state;
    bytes e = {.n = 0};
    head(&e);
    put1(&e, 0x91);
    put1(&e, 0x8b);
    str(&e, "type");
    str(&e, "BlockStored");
    str(&e, "block_hashes");
    put1(&e, 0x92);
    u64(&e, H0);
    u64(&e, H1);
    str(&e, "parent_block_hash");
    put1(&e, 0xc0);
    str(&e, "token_ids");
    put1(&e, 0x98);
    for (unsigned i = 1; i <= 8; i++)
        put1(&e, i);
    str(&e, "block_size");
    put1(&e, 0x04);
    str(&e, "lora_id");
    put1(&e, 0xc0);
    str(&e, "medium");
    str(&e, "GPU");
    str(&e, "lora_name");
    put1(&e, 0xc0);
    str(&e, "extra_keys");
    put(&e, "\x92\xc0\xc0", 3);
    str(&e, "group_idx");
    put1(&e, 0x00);
    str(&e, "kv_cache_spec_kind");
    str(&e, "full_attention");
    put1(&e, 0x00);
    assert_int_equal(e.n, 202);

    kvr_sim_evbatch b;
    kvr_sim_evbatch_init(&b, 1, 0);
    uint64_t h[2] = {H0, H1};
    assert_int_equal(kvr_sim_evbatch_stored(&b, h, 2, 0, 0, TOKENS, 8, 4), 0);
    kvr_buf out;
    finish(&b, &out);
    assert_int_equal(out.len, e.n);
    assert_memory_equal(out.data, e.b, e.n);
    kvr_buf_free(&out);
    kvr_sim_evbatch_free(&b);
}

static void test_removed_cleared_and_parent_bytes(void **state)
{
    (void)state;
    /* BlockRemoved, array: 93 cb… 91 94 ac "BlockRemoved" 91 cf <h1> a3 "GPU" 00 00 */
    bytes e = {.n = 0};
    head(&e);
    put(&e, "\x91\x94", 2);
    str(&e, "BlockRemoved");
    put1(&e, 0x91);
    u64(&e, H1);
    str(&e, "GPU");
    put1(&e, 0x00);
    put1(&e, 0x00);
    kvr_sim_evbatch b;
    kvr_sim_evbatch_init(&b, 0, 0);
    assert_int_equal(kvr_sim_evbatch_removed(&b, H1), 0);
    kvr_buf out;
    finish(&b, &out);
    assert_int_equal(out.len, e.n);
    assert_memory_equal(out.data, e.b, e.n);
    kvr_buf_free(&out);

    /* AllBlocksCleared: … 91 91 b0 "AllBlocksCleared" 00 (array), … 91 81 a4 "type" b0 … 00 (map) */
    for (int map = 0; map <= 1; map++) {
        bytes c = {.n = 0};
        head(&c);
        put1(&c, 0x91);
        if (map) {
            put1(&c, 0x81);
            str(&c, "type");
        } else {
            put1(&c, 0x91);
        }
        str(&c, "AllBlocksCleared");
        put1(&c, 0x00);
        kvr_sim_evbatch_free(&b);
        kvr_sim_evbatch_init(&b, map, 0);
        assert_int_equal(kvr_sim_evbatch_cleared(&b), 0);
        finish(&b, &out);
        assert_int_equal(out.len, c.n);
        assert_memory_equal(out.data, c.b, c.n);
        kvr_buf_free(&out);
    }

    /* a parent hash is a uint64 in place of nil; an empty batch still has 3 elements */
    kvr_sim_evbatch_free(&b);
    kvr_sim_evbatch_init(&b, 0, 0);
    uint64_t h[1] = {H1};
    assert_int_equal(kvr_sim_evbatch_stored(&b, h, 1, 1, H0, TOKENS + 4, 4, 4), 0);
    finish(&b, &out);
    const unsigned char *p = (const unsigned char *)out.data;
    /* 93 cb+8 91 9b ab+11 91 cf+8 → parent at offset 1+9+1+1+12+1+9 = 34 */
    assert_int_equal(p[34], 0xcf);
    kvr_buf_free(&out);
    finish(&b, &out);
    assert_int_equal(out.len, 12); /* 93 cb+8 90 00 */
    assert_int_equal((unsigned char)out.data[10], 0x90);
    kvr_buf_free(&out);
    kvr_sim_evbatch_free(&b);
}

static void test_batch_cap_drops_whole_events(void **state)
{
    (void)state;
    kvr_sim_evbatch b;
    kvr_sim_evbatch_init(&b, 0, 40);
    assert_int_equal(kvr_sim_evbatch_removed(&b, H0), 0); /* 29 bytes */
    assert_int_equal(kvr_sim_evbatch_removed(&b, H1), -1);
    assert_int_equal(b.nevents, 1);
    assert_int_equal(b.events.len, 29);
    kvr_sim_evbatch_free(&b);
}

/* ---- publisher over ipc:// (no TCP port needed) ---- */

static int recv_parts(void *sock, zmq_msg_t *parts, int max, int timeout_ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    int n = 0, more = 1;
    while (more && n < max) {
        zmq_msg_init(&parts[n]);
        zmq_msg_recv(&parts[n], sock, 0);
        more = zmq_msg_more(&parts[n]);
        n++;
    }
    return n;
}

static uint64_t be64(const zmq_msg_t *m)
{
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)m);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static void test_publish_and_replay(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvr-sim-ev-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char pub_ep[128], rep_ep[128];
    snprintf(pub_ep, sizeof(pub_ep), "ipc://%s/pub", dir);
    snprintf(rep_ep, sizeof(rep_ep), "ipc://%s/replay", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_sim_events_cfg cfg = {.endpoint = pub_ep, .replay_endpoint = rep_ep, .topic = "kv@sim",
                              .hwm = 1000, .buffer_steps = 3, .buffer_bytes = 1 << 20,
                              .max_batch_bytes = 1 << 20};
    char err[256];
    kvr_sim_events *ev = kvr_sim_events_new(&loop, &cfg, err, sizeof(err));
    assert_non_null(ev);

    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    assert_int_equal(zmq_connect(sub, pub_ep), 0);
    usleep(200 * 1000); /* PUB/SUB slow joiner; the replay check below does not rely on it */

    kvr_sim_kv_sink sink;
    kvr_sim_events_sink(ev, &sink);
    kvr_sim_events_flush(ev); /* empty: publishes nothing */
    assert_int_equal(kvr_sim_events_next_seq(ev), 0);
    for (int i = 0; i < 5; i++) {
        sink.removed(sink.ud, (uint64_t)i);
        kvr_sim_events_flush(ev);
    }
    assert_int_equal(kvr_sim_events_next_seq(ev), 5);

    zmq_msg_t parts[6];
    int n = recv_parts(sub, parts, 6, 2000);
    assert_int_equal(n, 3);
    assert_int_equal(zmq_msg_size(&parts[0]), 6);
    assert_memory_equal(zmq_msg_data(&parts[0]), "kv@sim", 6);
    assert_int_equal(zmq_msg_size(&parts[1]), 8);
    assert_int_equal(be64(&parts[1]), 0);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);

    /* replay from 1: only seqs 2..4 are still buffered (buffer_steps 3), then the end marker */
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(dealer, rep_ep), 0);
    unsigned char start[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, start, 8, 0);
    uint64_t expect = 2;
    int got_end = 0;
    for (int guard = 0; guard < 400 && !got_end; guard++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        n = recv_parts(dealer, parts, 6, 10);
        if (n == 0)
            continue;
        assert_int_equal(n, 4); /* [empty, topic, seq, payload] */
        assert_int_equal(zmq_msg_size(&parts[0]), 0);
        assert_int_equal(zmq_msg_size(&parts[1]), 6);
        uint64_t seq = be64(&parts[2]);
        if (seq == UINT64_MAX) {
            assert_int_equal(zmq_msg_size(&parts[3]), 0);
            got_end = 1;
        } else {
            assert_int_equal(seq, expect);
            expect++;
            assert_true(zmq_msg_size(&parts[3]) > 10);
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
    }
    assert_true(got_end);
    assert_int_equal(expect, 5);

    zmq_close(dealer);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    kvr_sim_events_close(ev);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    char path[160];
    snprintf(path, sizeof(path), "%s/pub", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/replay", dir);
    unlink(path);
    rmdir(dir);
}

static void test_bad_endpoint_reports_error(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_sim_events_cfg cfg = {.endpoint = "nonsense://x", .hwm = 10, .buffer_steps = 1};
    char err[256] = "";
    assert_null(kvr_sim_events_new(&loop, &cfg, err, sizeof(err)));
    assert_true(strlen(err) > 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* Several data-parallel ranks on one publisher (--kv-events-dp shared): each rank's events go
 * into its own batch, flushed on its own step, numbered in one sequence and carrying its rank
 * as data_parallel_rank (the payload's last element). */
static void test_shared_publisher_ranks(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvr-sim-ev-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char ep[128];
    snprintf(ep, sizeof(ep), "ipc://%s/pub", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_sim_events_cfg cfg = {.endpoint = ep, .hwm = 1000, .buffer_steps = 4,
                              .buffer_bytes = 1 << 20, .max_batch_bytes = 1 << 20,
                              .dp_rank = 0, .nranks = 3};
    char err[256];
    kvr_sim_events *ev = kvr_sim_events_new(&loop, &cfg, err, sizeof(err));
    assert_non_null(ev);
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    assert_int_equal(zmq_connect(sub, ep), 0);
    usleep(200 * 1000); /* PUB/SUB slow joiner */

    kvr_sim_kv_sink s1, s2;
    kvr_sim_events_sink_rank(ev, 1, &s1);
    kvr_sim_events_sink_rank(ev, 2, &s2);
    s2.removed(s2.ud, 7);
    s1.removed(s1.ud, 9);
    kvr_sim_events_flush_rank(ev, 0); /* rank 0 has nothing: no batch */
    kvr_sim_events_flush_rank(ev, 1);
    kvr_sim_events_flush_rank(ev, 2);
    assert_int_equal(kvr_sim_events_next_seq(ev), 2);
    unsigned char want_rank[2] = {1, 2};
    for (int i = 0; i < 2; i++) {
        zmq_msg_t parts[4];
        int n = recv_parts(sub, parts, 4, 2000);
        assert_int_equal(n, 3);
        assert_int_equal(be64(&parts[1]), (uint64_t)i);
        const unsigned char *p = zmq_msg_data(&parts[2]);
        size_t len = zmq_msg_size(&parts[2]);
        assert_int_equal(p[0], 0x93);                /* [ts, events, rank] */
        assert_int_equal(p[len - 1], want_rank[i]); /* positive fixint rank */
        for (int k = 0; k < n; k++)
            zmq_msg_close(&parts[k]);
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    kvr_sim_events_close(ev);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    char path[160];
    snprintf(path, sizeof(path), "%s/pub", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_stored_array_bytes),
        cmocka_unit_test(test_block_stored_map_bytes),
        cmocka_unit_test(test_removed_cleared_and_parent_bytes),
        cmocka_unit_test(test_batch_cap_drops_whole_events),
        cmocka_unit_test(test_publish_and_replay),
        cmocka_unit_test(test_bad_endpoint_reports_error),
        cmocka_unit_test(test_shared_publisher_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
