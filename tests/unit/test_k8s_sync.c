/* One Service's slices → worker add / drain / remove calls (src/workers/k8s_sync.h), with
 * recording hooks: the endpoint conditions' meaning, several slices, relists, refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "workers/k8s_sync.h"

typedef struct rec {
    char log[4096];
    int refuse; /* add returns -1 */
} rec;

static int h_add(void *ud, const char *service, const char *name, const char *url,
                 const char *kv, const char *kv_replay)
{
    rec *r = ud;
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof(r->log) - n, "add %s %s %s %s %s;", service, name, url,
             kv ? kv : "-", kv_replay ? kv_replay : "-");
    return r->refuse ? -1 : 0;
}

static void h_drain(void *ud, const char *url, int d)
{
    rec *r = ud;
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof(r->log) - n, "drain %s %d;", url, d);
}

static void h_remove(void *ud, const char *url)
{
    rec *r = ud;
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof(r->log) - n, "remove %s;", url);
}

/* A slice `name` with endpoints "IP:r:s:t,..." (r, s, t: 1/0 conditions), port 80. */
static kvr_k8s_slice mk(const char *name, const char *spec)
{
    kvr_k8s_slice s;
    memset(&s, 0, sizeof(s));
    snprintf(s.name, sizeof(s.name), "%s", name);
    s.port = 80;
    s.eps = calloc(8, sizeof(*s.eps));
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *tok = strtok(buf, ","); tok && s.neps < 8; tok = strtok(NULL, ",")) {
        kvr_k8s_endpoint *e = &s.eps[s.neps++];
        char ip[32];
        int rd, sv, tm;
        assert_int_equal(sscanf(tok, "%31[^:]:%d:%d:%d", ip, &rd, &sv, &tm), 4);
        snprintf(e->url, sizeof(e->url), "http://%s:80", ip);
        snprintf(e->name, sizeof(e->name), "pod-%s", ip);
        e->ready = rd;
        e->serving = sv;
        e->terminating = tm;
    }
    return s;
}

static void event(kvr_k8s_sync *st, const char *name, const char *spec, int del, rec *r,
                  const kvr_k8s_hooks *h)
{
    kvr_k8s_slice s = mk(name, spec);
    r->log[0] = '\0';
    kvr_k8s_sync_event(st, &s, del);
    kvr_k8s_sync_apply(st, h);
}

static void test_lifecycle(void **state)
{
    (void)state;
    rec r = {0};
    kvr_k8s_hooks h = {h_add, h_drain, h_remove, NULL, &r};
    kvr_k8s_sync st = {.service = "vllm"};
    /* ready → added; not ready (never ready) → not added */
    event(&st, "a", "10.0.0.1:1:1:0,10.0.0.2:0:0:0", 0, &r, &h);
    assert_string_equal(r.log, "add vllm pod-10.0.0.1 http://10.0.0.1:80 - -;");
    assert_int_equal(kvr_k8s_sync_added(&st), 1);
    /* the second becomes ready; the first terminating (serving) → draining */
    event(&st, "a", "10.0.0.1:0:1:1,10.0.0.2:1:1:0", 0, &r, &h);
    assert_string_equal(r.log,
                        "drain http://10.0.0.1:80 1;add vllm pod-10.0.0.2 http://10.0.0.2:80 - -;");
    /* the same event again: nothing */
    event(&st, "a", "10.0.0.1:0:1:1,10.0.0.2:1:1:0", 0, &r, &h);
    assert_string_equal(r.log, "");
    /* ready again (a readiness blip), then gone */
    event(&st, "a", "10.0.0.1:1:1:0,10.0.0.2:1:1:0", 0, &r, &h);
    assert_string_equal(r.log, "drain http://10.0.0.1:80 0;");
    event(&st, "a", "10.0.0.2:1:1:0", 0, &r, &h);
    assert_string_equal(r.log, "remove http://10.0.0.1:80;");
    /* a slice deleted takes its endpoints */
    event(&st, "a", "", 1, &r, &h);
    assert_string_equal(r.log, "remove http://10.0.0.2:80;");
    assert_int_equal(kvr_k8s_sync_added(&st), 0);
    kvr_k8s_sync_free(&st);
}

static void test_two_slices_best_state(void **state)
{
    (void)state;
    rec r = {0};
    kvr_k8s_hooks h = {h_add, h_drain, h_remove, NULL, &r};
    kvr_k8s_sync st = {.service = "s"};
    event(&st, "a", "10.0.0.1:1:1:0", 0, &r, &h);
    /* the endpoint moves between slices: listed terminating in b while still ready in a */
    event(&st, "b", "10.0.0.1:0:1:1", 0, &r, &h);
    assert_string_equal(r.log, "");
    event(&st, "a", "", 1, &r, &h);
    assert_string_equal(r.log, "drain http://10.0.0.1:80 1;");
    /* a relist without it: removed */
    r.log[0] = '\0';
    kvr_k8s_slice *none = calloc(1, sizeof(*none));
    kvr_k8s_sync_replace(&st, none, 0);
    kvr_k8s_sync_apply(&st, &h);
    assert_string_equal(r.log, "remove http://10.0.0.1:80;");
    kvr_k8s_sync_free(&st);
}

static void test_refused_left_alone(void **state)
{
    (void)state;
    rec r = {.refuse = 1};
    kvr_k8s_hooks h = {h_add, h_drain, h_remove, NULL, &r};
    kvr_k8s_sync st = {.service = "s"};
    event(&st, "a", "10.0.0.9:1:1:0", 0, &r, &h);
    assert_string_equal(r.log, "add s pod-10.0.0.9 http://10.0.0.9:80 - -;");
    r.refuse = 0;
    event(&st, "a", "10.0.0.9:0:1:1", 0, &r, &h); /* no drain call for a refused one */
    assert_string_equal(r.log, "");
    event(&st, "a", "", 1, &r, &h); /* nor a remove */
    assert_string_equal(r.log, "");
    event(&st, "a", "10.0.0.9:1:1:0", 0, &r, &h); /* back: offered again */
    assert_string_equal(r.log, "add s pod-10.0.0.9 http://10.0.0.9:80 - -;");
    kvr_k8s_sync_free(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_two_slices_best_state),
        cmocka_unit_test(test_refused_left_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
