/* The cluster client without a Redis (cluster/cluster.h): against a port nobody listens on it
 * never blocks the loop, counts its failed connections, reports down, ends its warm start at
 * --redis-warm-timeout-ms, releases held requests at once, answers rate checks "unknown" on a
 * later loop turn (never from inside the call), keeps appended entries within its queue bound,
 * and closes cleanly (ASan: nothing leaks). A bad configuration is refused up front. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster.h"
#include "util/time.h"

static int rate_calls, rate_answer = 99, woke;

static void on_rate(void *ud, int allowed, uint64_t retry_ms)
{
    (void)ud;
    (void)retry_ms;
    rate_calls++;
    rate_answer = allowed;
}

static void on_wake(void *ud)
{
    (void)ud;
    woke++;
}

static void stop_loop(uv_timer_t *t)
{
    uv_stop(t->loop);
}

static void run_for(uv_loop_t *loop, uint64_t ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, stop_loop, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void test_without_redis(void **st)
{
    (void)st;
    uv_loop_t loop;
    uv_loop_init(&loop);
    kvr_metrics *m = kvr_metrics_new();
    kvr_cluster_cfg cfg;
    kvr_cluster_cfg_default(&cfg);
    cfg.url = "redis://127.0.0.1:1/0"; /* nothing listens on port 1 */
    cfg.replica_id = "unit";
    cfg.warm_timeout_ms = 150;
    cfg.queue_max = 3;
    kvr_cluster_hooks hooks = {0};
    char err[256];
    uint64_t t0 = kvr_now_ms();
    kvr_cluster *c = kvr_cluster_new(&loop, &cfg, m, &hooks, err, sizeof(err));
    assert_non_null(c);
    assert_true(kvr_now_ms() - t0 < 50); /* starting never waits for Redis */
    assert_string_equal(kvr_cluster_replica_id(c), "unit");
    assert_false(kvr_cluster_warm(c));

    kvr_cluster_rate_op *op = kvr_cluster_rate(c, "key", 10, 1, on_rate, NULL);
    assert_non_null(op);
    assert_int_equal(rate_calls, 0); /* never from inside the call */
    unsigned char k8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; i < 5; i++) {
        kvr_entry e = {.type = KVR_ENTRY_TEACH, .route = "m", .route_len = 1, .worker = "w",
                       .worker_len = 1, .block_bytes = 64, .keys = k8, .nkeys = 1};
        kvr_cluster_append(c, &e);
    }
    run_for(&loop, 100);
    assert_int_equal(rate_calls, 1);
    assert_int_equal(rate_answer, -1);
    assert_false(kvr_cluster_up(c));
    const char *conn[] = {"connect"}, *queue[] = {"queue"};
    assert_true(kvr_metric_get(kvr_metrics_find(m, "kvroute_redis_errors_total"), conn) >= 1);
    assert_int_equal(kvr_metric_get(kvr_metrics_find(m, "kvroute_redis_errors_total"), queue), 2);
    assert_int_equal(kvr_metric_get(kvr_metrics_find(m, "kvroute_redis_up"), NULL), 0);
    /* Redis failed: nothing is held for the warm start any more */
    assert_false(kvr_cluster_holding(c));
    kvr_cluster_wait *w = kvr_cluster_wait_warm(c, on_wake, NULL);
    assert_non_null(w);
    assert_int_equal(woke, 0);
    run_for(&loop, 100);
    assert_int_equal(woke, 1);
    assert_true(kvr_cluster_warm(c)); /* the warm timeout (150 ms) passed */
    json_t *j = kvr_cluster_json(c);
    assert_string_equal(json_string_value(json_object_get(j, "replica_id")), "unit");
    assert_false(json_is_true(json_object_get(j, "redis_up")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "log"), "queued")),
                     3);
    json_decref(j);
    /* a cancelled check answers nothing */
    rate_calls = 0;
    op = kvr_cluster_rate(c, "key", 10, 1, on_rate, NULL);
    kvr_cluster_rate_cancel(op);
    run_for(&loop, 20);
    assert_int_equal(rate_calls, 0);
    kvr_cluster_close(c);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    kvr_metrics_free(m);
}

static void test_bad_configuration(void **st)
{
    (void)st;
    kvr_cluster_cfg cfg;
    kvr_cluster_cfg_default(&cfg);
    char err[256];
    cfg.url = "rediss://h:1";
    assert_int_equal(kvr_cluster_check(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "TLS"));
    cfg.url = "redis://h:1";
    cfg.password_file = "/nonexistent/pw";
    assert_int_equal(kvr_cluster_check(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/pw"));
    cfg.password_file = NULL;
    cfg.replica_id = "";
    assert_int_equal(kvr_cluster_check(&cfg, err, sizeof(err)), -1);
    cfg.replica_id = "ok";
    assert_int_equal(kvr_cluster_check(&cfg, err, sizeof(err)), 0);
    kvr_cluster_hooks hooks = {0};
    cfg.url = "http://x";
    assert_null(kvr_cluster_new(uv_default_loop(), &cfg, NULL, &hooks, err, sizeof(err)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_redis),
        cmocka_unit_test(test_bad_configuration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
