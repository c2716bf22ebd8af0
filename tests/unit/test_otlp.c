/* The OTLP exporter's bounds (obs/otlp.c): spans past --otlp-max-queue are dropped and counted
 * at once; a collector that refuses connections loses every batch, counted, never retried;
 * the queue gauge follows. The encoding and the exchange with a live collector are covered
 * end to end (tests/e2e/test_tracing.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "obs/otlp.h"
#include "util/time.h"

/* A port nothing listens on: bound, never listening (connect is refused). */
static int closed_port(uv_loop_t *loop, uv_tcp_t *h)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_init(loop, h);
    assert_int_equal(uv_tcp_bind(h, (const struct sockaddr *)&a, 0), 0);
    int len = sizeof(a);
    uv_tcp_getsockname(h, (struct sockaddr *)&a, &len);
    return ntohs(a.sin_port);
}

static void test_drops_are_counted(void **st)
{
    (void)st;
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_tcp_t hold;
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/traces", closed_port(&loop, &hold));
    kvr_otlp_cfg c;
    kvr_otlp_cfg_default(&c);
    c.endpoint = url;
    c.batch_size = 2;
    c.max_queue = 3;
    c.flush_ms = 10;
    kvr_upstream_opts o;
    kvr_upstream_opts_default(&o);
    kvr_upstream *up = kvr_upstream_new(&loop, &o);
    kvr_metrics *m = kvr_metrics_new();
    kvr_otlp *x = kvr_otlp_new(&loop, up, m, &c);
    assert_non_null(x);
    kvr_metric *dropped = kvr_metrics_find(m, "kvroute_otlp_dropped_spans_total");
    kvr_metric *queued = kvr_metrics_find(m, "kvroute_otlp_queue_spans");
    uint8_t tid[16] = {1}, sid[8] = {2};
    kvr_span_attr a = {.key = "kvroute.route", .type = KVR_ATTR_STR, .s = "m"};
    kvr_span s = {.trace_id = tid, .span_id = sid, .name = "POST /v1/chat/completions",
                  .kind = KVR_SPAN_SERVER, .start_unix_ns = 1, .end_unix_ns = 2,
                  .attrs = &a, .nattrs = 1};
    for (int i = 0; i < 5; i++)
        kvr_otlp_record(x, &s);
    assert_true(kvr_metric_get(dropped, NULL) == 2); /* the queue holds 3 */
    assert_true(kvr_metric_get(queued, NULL) == 3);
    uint64_t deadline = kvr_now_ms() + 5000;
    while (kvr_metric_get(dropped, NULL) < 5 && kvr_now_ms() < deadline)
        uv_run(&loop, UV_RUN_ONCE);
    assert_true(kvr_metric_get(dropped, NULL) == 5); /* both batches refused */
    assert_true(kvr_metric_get(queued, NULL) == 0);
    assert_true(kvr_metric_get(kvr_metrics_find(m, "kvroute_otlp_exported_spans_total"),
                               NULL) == 0);
    kvr_otlp_close(x);
    kvr_upstream_close(up);
    uv_close((uv_handle_t *)&hold, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    kvr_metrics_free(m);
}

static void test_off_without_endpoint(void **st)
{
    (void)st;
    kvr_otlp_cfg c;
    kvr_otlp_cfg_default(&c);
    assert_null(kvr_otlp_new(NULL, NULL, NULL, &c));
    c.endpoint = "";
    assert_null(kvr_otlp_new(NULL, NULL, NULL, &c));
    kvr_otlp_record(NULL, NULL); /* a no-op, as the proxy calls it with tracing off */
    kvr_otlp_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drops_are_counted),
        cmocka_unit_test(test_off_without_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
