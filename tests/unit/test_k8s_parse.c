/* EndpointSlice lists and watch events (src/workers/k8s_parse.h): conditions as the API
 * defines their defaults, port selection, addresses checked, odd shapes refused or skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "workers/k8s_parse.h"

static const kvr_k8s_sel ANY = {NULL, 1000, NULL, NULL};

static int event(const char *s, const kvr_k8s_sel *sel, kvr_k8s_event *ev)
{
    char err[128];
    return kvr_k8s_parse_event(s, strlen(s), sel, ev, err, sizeof(err));
}

#define SLICE(eps, ports)                                                                     \
    "{\"metadata\":{\"name\":\"vllm-abc\",\"resourceVersion\":\"42\"},\"addressType\":\"IPv4\"," \
    "\"endpoints\":" eps ",\"ports\":" ports "}"

static void test_conditions(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    const char *s = "{\"type\":\"ADDED\",\"object\":" SLICE(
        "[{\"addresses\":[\"10.0.0.1\"],\"conditions\":{\"ready\":true},"
        "\"targetRef\":{\"kind\":\"Pod\",\"name\":\"vllm-0\"}},"
        "{\"addresses\":[\"10.0.0.2\"],\"conditions\":{\"ready\":false,\"serving\":true,"
        "\"terminating\":true},\"targetRef\":{\"name\":\"vllm-1\"}},"
        "{\"addresses\":[\"10.0.0.3\"]},"
        "{\"addresses\":[\"10.0.0.4\"],\"conditions\":{\"ready\":false}}]",
        "[{\"name\":\"http\",\"port\":8000}]") "}";
    assert_int_equal(event(s, &ANY, &ev), 0);
    assert_int_equal(ev.type, KVR_K8S_ADDED);
    assert_string_equal(ev.rv, "42");
    assert_string_equal(ev.slice.name, "vllm-abc");
    assert_int_equal(ev.slice.neps, 4);
    kvr_k8s_endpoint *e = ev.slice.eps;
    assert_string_equal(e[0].url, "http://10.0.0.1:8000");
    assert_string_equal(e[0].name, "vllm-0");
    assert_true(e[0].ready && e[0].serving && !e[0].terminating);
    assert_true(!e[1].ready && e[1].serving && e[1].terminating);
    /* no conditions: ready (null = ready), serving defers to ready, not terminating */
    assert_true(e[2].ready && e[2].serving && !e[2].terminating);
    assert_string_equal(e[2].name, "");
    assert_true(!e[3].ready && !e[3].serving);
    kvr_k8s_slice_free(&ev.slice);
}

static void test_ports(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    const char *s = "{\"type\":\"MODIFIED\",\"object\":" SLICE(
        "[{\"addresses\":[\"10.0.0.1\"]}]",
        "[{\"name\":\"metrics\",\"port\":9090},{\"name\":\"http\",\"port\":8000}]") "}";
    assert_int_equal(event(s, &ANY, &ev), 0);
    assert_int_equal(ev.slice.port, 8000); /* the one named http */
    kvr_k8s_slice_free(&ev.slice);
    kvr_k8s_sel byname = {"metrics", 1000, NULL, NULL}, bynum = {"7000", 1000, NULL, NULL},
                missing = {"grpc", 1000, NULL, NULL};
    assert_int_equal(event(s, &byname, &ev), 0);
    assert_string_equal(ev.slice.eps[0].url, "http://10.0.0.1:9090");
    kvr_k8s_slice_free(&ev.slice);
    assert_int_equal(event(s, &bynum, &ev), 0);
    assert_int_equal(ev.slice.port, 7000);
    kvr_k8s_slice_free(&ev.slice);
    assert_int_equal(event(s, &missing, &ev), 0);
    assert_int_equal(ev.slice.neps, 0); /* a slice without the port: no workers */
    kvr_k8s_slice_free(&ev.slice);
}

static void test_kv_event_ports(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    const char *s = "{\"type\":\"ADDED\",\"object\":" SLICE(
        "[{\"addresses\":[\"10.0.0.1\"]}]",
        "[{\"name\":\"http\",\"port\":8000},{\"name\":\"kv-events\",\"port\":5557},"
        "{\"name\":\"kv-replay\",\"port\":5558}]") "}";
    kvr_k8s_sel sel = {"http", 1000, "kv-events", "kv-replay"};
    assert_int_equal(event(s, &sel, &ev), 0);
    assert_string_equal(ev.slice.eps[0].url, "http://10.0.0.1:8000");
    assert_string_equal(ev.slice.eps[0].kv_url, "tcp://10.0.0.1:5557");
    assert_string_equal(ev.slice.eps[0].kv_replay_url, "tcp://10.0.0.1:5558");
    kvr_k8s_slice_free(&ev.slice);
    kvr_k8s_sel none = {"http", 1000, NULL, "kv-replay"}, missing = {"http", 1000, "zmq", NULL},
                num = {"http", 1000, "6000", NULL};
    assert_int_equal(event(s, &none, &ev), 0);
    assert_string_equal(ev.slice.eps[0].kv_url, "");
    assert_string_equal(ev.slice.eps[0].kv_replay_url, ""); /* no replay without events */
    kvr_k8s_slice_free(&ev.slice);
    assert_int_equal(event(s, &missing, &ev), 0);
    assert_string_equal(ev.slice.eps[0].kv_url, "");
    assert_string_equal(ev.slice.eps[0].url, "http://10.0.0.1:8000");
    kvr_k8s_slice_free(&ev.slice);
    assert_int_equal(event(s, &num, &ev), 0);
    assert_string_equal(ev.slice.eps[0].kv_url, "tcp://10.0.0.1:6000");
    kvr_k8s_slice_free(&ev.slice);
}

static void test_addresses_checked(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    const char *s = "{\"type\":\"ADDED\",\"object\":" SLICE(
        "[{\"addresses\":[\"10.0.0.1/evil\",\"999.1.1.1\",\"10.0.0.9\",7],"
        "\"targetRef\":{\"name\":\"Bad Name\\\"\"}}]",
        "[{\"port\":8000}]") "}";
    assert_int_equal(event(s, &ANY, &ev), 0);
    assert_int_equal(ev.slice.neps, 1);
    assert_string_equal(ev.slice.eps[0].url, "http://10.0.0.9:8000");
    assert_string_equal(ev.slice.eps[0].name, ""); /* not a DNS name: unused */
    kvr_k8s_slice_free(&ev.slice);
    const char *v6 = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\"},"
                     "\"addressType\":\"IPv6\",\"endpoints\":[{\"addresses\":[\"fd00::1\"]}],"
                     "\"ports\":[{\"port\":80}]}}";
    assert_int_equal(event(v6, &ANY, &ev), 0);
    assert_string_equal(ev.slice.eps[0].url, "http://[fd00::1]:80");
    kvr_k8s_slice_free(&ev.slice);
    const char *fqdn = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\"},"
                       "\"addressType\":\"FQDN\",\"endpoints\":[{\"addresses\":[\"a.b\"]}],"
                       "\"ports\":[{\"port\":80}]}}";
    assert_int_equal(event(fqdn, &ANY, &ev), 0);
    assert_int_equal(ev.slice.neps, 0);
    kvr_k8s_slice_free(&ev.slice);
    /* the per-slice cap */
    kvr_k8s_sel one = {NULL, 1, NULL, NULL};
    const char *two = "{\"type\":\"ADDED\",\"object\":" SLICE(
        "[{\"addresses\":[\"10.0.0.1\",\"10.0.0.2\"]},{\"addresses\":[\"10.0.0.3\"]}]",
        "[{\"port\":1}]") "}";
    assert_int_equal(event(two, &one, &ev), 0);
    assert_int_equal(ev.slice.neps, 1);
    kvr_k8s_slice_free(&ev.slice);
}

static void test_error_and_bookmark(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    assert_int_equal(event("{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,"
                           "\"reason\":\"Expired\"}}",
                           &ANY, &ev),
                     0);
    assert_int_equal(ev.type, KVR_K8S_ERROR);
    assert_int_equal(ev.code, 410);
    assert_string_equal(ev.reason, "Expired");
    assert_int_equal(event("{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"EndpointSlice\","
                           "\"metadata\":{\"resourceVersion\":\"12345\"}}}",
                           &ANY, &ev),
                     0);
    assert_int_equal(ev.type, KVR_K8S_BOOKMARK);
    assert_string_equal(ev.rv, "12345");
}

static void test_refused(void **state)
{
    (void)state;
    kvr_k8s_event ev;
    const char *bad[] = {
        "", "null", "[]", "{\"type\":\"ADDED\"}", "{\"type\":\"WHAT\",\"object\":{}}",
        "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}",
        "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":7}}}",
        "{\"type\":1,\"object\":{}}", "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"\"}}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(event(bad[i], &ANY, &ev), -1);
        assert_null(ev.slice.eps);
    }
}

static void test_list(void **state)
{
    (void)state;
    const char *s = "{\"kind\":\"EndpointSliceList\",\"metadata\":{\"resourceVersion\":\"77\"},"
                    "\"items\":[" SLICE("[{\"addresses\":[\"10.0.0.1\"]}]", "[{\"port\":8000}]")
                    ",{\"metadata\":{}},7]}";
    kvr_k8s_slice *ss;
    char rv[KVR_K8S_RV_MAX + 1], err[128];
    int n = kvr_k8s_parse_list(s, strlen(s), &ANY, &ss, rv, err, sizeof(err));
    assert_int_equal(n, 1);
    assert_string_equal(rv, "77");
    assert_string_equal(ss[0].eps[0].url, "http://10.0.0.1:8000");
    kvr_k8s_slice_free(&ss[0]);
    free(ss);
    const char *empty = "{\"kind\":\"EndpointSliceList\",\"metadata\":{\"resourceVersion\":\"5\"},"
                        "\"items\":null}";
    n = kvr_k8s_parse_list(empty, strlen(empty), &ANY, &ss, rv, err, sizeof(err));
    assert_int_equal(n, 0);
    free(ss);
    assert_int_equal(kvr_k8s_parse_list("[1]", 3, &ANY, &ss, rv, err, sizeof(err)), -1);
    assert_int_equal(kvr_k8s_parse_list("{\"items\":{}}", 12, &ANY, &ss, rv, err, sizeof(err)),
                     -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conditions),       cmocka_unit_test(test_ports),
        cmocka_unit_test(test_addresses_checked), cmocka_unit_test(test_error_and_bookmark),
        cmocka_unit_test(test_refused),          cmocka_unit_test(test_list),
        cmocka_unit_test(test_kv_event_ports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
