/* Data-parallel workers (issue 21): `--worker URL@N` and `data_parallel_size` expand into one
 * worker per rank ("URL#r"), with KV-event endpoints offset per rank or shared; the ranks of an
 * engine share its URL, health check and circuit breaker but each is its own worker; an
 * engine's /metrics are split by their `engine` label. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "config_loaded.h"
#include "workers/engine.h"
#include "workers/health.h"
#include "workers/registry.h"
#include "workers/scrape.h"

/* ---- --worker URL@N ------------------------------------------------------------------ */

static void split_only_a_trailing_number(void **state)
{
    (void)state;
    size_t ul;
    uint32_t n;
    assert_int_equal(kvr_config_split_dp("http://h:9001@4", &ul, &n), 0);
    assert_int_equal(ul, strlen("http://h:9001"));
    assert_int_equal(n, 4);
    /* userinfo: the '@' belongs to the URL */
    assert_int_equal(kvr_config_split_dp("http://u@h:9001", &ul, &n), 0);
    assert_int_equal(ul, strlen("http://u@h:9001"));
    assert_int_equal(n, 0);
    assert_int_equal(kvr_config_split_dp("http://u@h:9001@2", &ul, &n), 0);
    assert_int_equal(ul, strlen("http://u@h:9001"));
    assert_int_equal(n, 2);
    assert_int_equal(kvr_config_split_dp("http://u@h:9001/x@", &ul, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_config_split_dp("http://h@2x", &ul, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvr_config_split_dp("http://h:1@0", &ul, &n), -1);
    assert_int_equal(kvr_config_split_dp("http://h:1@257", &ul, &n), -1);
    assert_int_equal(kvr_config_split_dp("http://h:1@99999999999", &ul, &n), -1);
    assert_int_equal(kvr_config_split_dp("http://h:1@256", &ul, &n), 0);
    assert_int_equal(n, 256);
}

static void cli_worker_expands_into_ranks(void **state)
{
    (void)state;
    kvr_config c;
    kvr_errlist errs = {0};
    kvr_config_default(&c);
    char *argv[] = {"kvroute", "--worker", "http://127.0.0.1:9001@3", "--worker",
                    "http://127.0.0.1:9002", "--model", "m"};
    assert_int_equal(kvr_config_load(&c, 7, argv, &errs), 0);
    assert_int_equal(c.nworkers, 4);
    for (int r = 0; r < 3; r++) {
        char u[64];
        snprintf(u, sizeof(u), "http://127.0.0.1:9001#%d", r);
        assert_string_equal(c.workers[r].url, u);
        assert_string_equal(c.workers[r].name, u);
        assert_string_equal(c.workers[r].dp_url, "http://127.0.0.1:9001");
        assert_int_equal(c.workers[r].dp_rank, r);
        assert_int_equal(c.workers[r].data_parallel_size, 3);
    }
    assert_string_equal(c.workers[3].url, "http://127.0.0.1:9002");
    assert_null(c.workers[3].dp_url);
    kvr_config_free(&c);
    kvr_errlist_free(&errs);
}

/* The whole load (as `kvroute --config PATH`), so the data-parallel expansion and checks run. */
static int load_argv(kvr_config *c, const char *path, kvr_errlist *errs)
{
    char *argv[] = {"kvroute", "--config", (char *)path};
    return kvr_config_load(c, 3, argv, errs);
}

static loaded *load(const char *yaml)
{
    return load_with(load_argv, yaml);
}

static void file_ranks_targets_and_event_ports(void **state)
{
    (void)state;
    loaded *l = load("workers:\n"
                     "  - url: http://127.0.0.1:9001\n"
                     "    name: eng\n"
                     "    data_parallel_size: 2\n"
                     "    kv_events: {endpoint: \"tcp://127.0.0.1:5557\",\n"
                     "                replay_endpoint: \"tcp://127.0.0.1:5600\",\n"
                     "                rank_port_offset: true}\n"
                     "  - url: http://127.0.0.1:9002\n"
                     "    data_parallel_size: 2\n"
                     "    kv_events: {endpoint: \"tcp://127.0.0.1:6000\"}\n"
                     "  - http://127.0.0.1:9003\n"
                     "routes:\n"
                     "  - name: m\n"
                     "    targets: [eng, {worker: \"http://127.0.0.1:9002\", weight: 2},\n"
                     "              \"http://127.0.0.1:9003\"]\n");
    for (size_t i = 0; i < l->errs.n; i++)
        fprintf(stderr, "%s\n", l->errs.msg[i]);
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->c.nworkers, 5);
    const kvr_worker_spec *w = l->c.workers;
    assert_string_equal(w[0].name, "eng#0");
    assert_string_equal(w[1].name, "eng#1");
    assert_string_equal(w[1].url, "http://127.0.0.1:9001#1");
    /* vLLM: rank r publishes on port + r, replays on replay port + r */
    assert_string_equal(w[0].kv_endpoint, "tcp://127.0.0.1:5557");
    assert_string_equal(w[1].kv_endpoint, "tcp://127.0.0.1:5558");
    assert_string_equal(w[1].kv_replay_endpoint, "tcp://127.0.0.1:5601");
    /* one endpoint shared by the ranks: kept as is (batches told apart by their rank) */
    assert_string_equal(w[2].kv_endpoint, "tcp://127.0.0.1:6000");
    assert_string_equal(w[3].kv_endpoint, "tcp://127.0.0.1:6000");
    assert_false(w[3].kv_rank_port_offset);
    assert_int_equal(w[3].dp_rank, 1);
    assert_null(w[4].dp_url);
    /* targets naming an engine name every rank, with the target's weight */
    const kvr_route_spec *r = &l->c.routes[0];
    assert_int_equal(r->ntargets, 5);
    assert_string_equal(r->targets[0].worker, "eng#0");
    assert_string_equal(r->targets[1].worker, "eng#1");
    assert_string_equal(r->targets[2].worker, "http://127.0.0.1:9002#0");
    assert_string_equal(r->targets[3].worker, "http://127.0.0.1:9002#1");
    assert_true(r->targets[3].weight == 2);
    assert_string_equal(r->targets[4].worker, "http://127.0.0.1:9003");
    done(l);
}

static void file_errors(void **state)
{
    (void)state;
    loaded *l = load("workers:\n"
                     "  - {url: \"http://127.0.0.1:9001\", data_parallel_size: 0}\n");
    assert_int_equal(l->rc, -1);
    assert_non_null(strstr(l->errs.msg[0], "data_parallel_size"));
    done(l);
    l = load("workers:\n"
             "  - url: http://127.0.0.1:9001\n"
             "    data_parallel_size: 4\n"
             "    kv_events: {endpoint: \"tcp://127.0.0.1:65534\", rank_port_offset: true}\n");
    assert_int_equal(l->rc, -1);
    assert_non_null(strstr(l->errs.msg[0], "past port 65535"));
    done(l);
    l = load("workers:\n"
             "  - url: http://127.0.0.1:9001\n"
             "    kv_events: {endpoint: \"tcp://127.0.0.1:5557\", rank_port_offset: maybe}\n");
    assert_int_equal(l->rc, -1);
    done(l);
}

/* ---- the registry ------------------------------------------------------------------- */

static void ranks_share_health_and_breaker_not_load(void **state)
{
    (void)state;
    kvr_registry *reg = kvr_registry_new();
    kvr_worker *r0 = kvr_registry_add_rank(reg, "http://127.0.0.1:9001/", 0, 3, "e#0", 1);
    kvr_worker *r1 = kvr_registry_add_rank(reg, "http://127.0.0.1:9001/", 1, 3, "e#1", 1);
    kvr_worker *r2 = kvr_registry_add_rank(reg, "http://127.0.0.1:9001/", 2, 3, NULL, 1);
    kvr_worker *p = kvr_registry_add(reg, "http://127.0.0.1:9002", NULL, 1);
    assert_non_null(r0);
    assert_non_null(r1);
    assert_non_null(r2);
    assert_null(kvr_registry_add_rank(reg, "http://127.0.0.1:9001/", 3, 3, NULL, 1));
    assert_null(kvr_registry_add_rank(reg, "http://127.0.0.1:9001/", 1, 3, "other", 1));
    assert_string_equal(r2->url, "http://127.0.0.1:9001/#2");
    assert_string_equal(r2->name, "http://127.0.0.1:9001/#2");
    assert_ptr_equal(r1->engine, r0);
    assert_ptr_equal(r0->engine, r0);
    assert_ptr_equal(p->engine, p);
    assert_int_equal(p->dp_rank, -1);
    char u[128];
    assert_int_equal(kvr_worker_url(r1, "/v1/chat/completions", u, sizeof(u)), 0);
    assert_string_equal(u, "http://127.0.0.1:9001/v1/chat/completions");
    kvr_worker *ranks[4];
    assert_int_equal(kvr_registry_ranks(reg, r0, ranks, 4), 2);
    assert_ptr_equal(ranks[0], r1);
    assert_int_equal(kvr_registry_ranks(reg, p, ranks, 4), 0);
    /* own load */
    kvr_worker_acquire(r1);
    assert_int_equal(r1->inflight, 1);
    assert_int_equal(r0->inflight, 0);
    kvr_worker_release(r1);
    /* one health: rank 0's check result, applied through any rank */
    kvr_workers_ctx ctx = {.reg = reg, .unhealthy_threshold = 1, .healthy_threshold = 1,
                           .forget_after_ms = 1000000};
    kvr_health_apply(&ctx, r2, 0, 5000);
    assert_false(kvr_worker_eligible(r0));
    assert_false(kvr_worker_eligible(r1));
    assert_false(kvr_worker_healthy(r2));
    assert_true(kvr_worker_eligible(p));
    kvr_health_apply(&ctx, r0, 1, 6000);
    assert_true(kvr_worker_eligible(r1));
    /* one breaker */
    kvr_breaker_cfg bc = {.failures = 1, .cooldown_ms = 1000, .max_cooldown_ms = 1000};
    kvr_breaker_on_result(kvr_worker_breaker(r2), &bc, 1, 0, 7000);
    assert_false(kvr_worker_eligible(r0));
    assert_false(kvr_worker_eligible(r1));
    assert_true(kvr_worker_eligible(p));
    /* removing rank 0 first keeps it alive for the others (they reference it) */
    kvr_registry_remove(reg, r0);
    assert_false(kvr_worker_eligible(r1));
    kvr_registry_remove(reg, r1);
    kvr_registry_remove(reg, r2);
    kvr_registry_free(reg);
}

static void readd_relinks_to_the_current_rank0(void **state)
{
    (void)state;
    kvr_registry *reg = kvr_registry_new();
    kvr_worker *r0 = kvr_registry_add_rank(reg, "http://h:1", 0, 2, NULL, 1);
    kvr_worker *r1 = kvr_registry_add_rank(reg, "http://h:1", 1, 2, NULL, 1);
    kvr_worker_ref(r1); /* a request still running on it */
    kvr_registry_remove(reg, r1);
    kvr_registry_remove(reg, r0);
    kvr_worker *n0 = kvr_registry_add_rank(reg, "http://h:1", 0, 2, NULL, 1);
    assert_ptr_not_equal(n0, r0); /* r0 lives on through r1's reference */
    assert_int_equal(kvr_registry_readd(reg, r1), 0);
    assert_ptr_equal(r1->engine, n0);
    kvr_worker_unref(r1);
    kvr_registry_free(reg);
}

/* ---- forgetting and scraping -------------------------------------------------------- */

static int g_forgot;
static void count_forget(void *ud, kvr_worker *w)
{
    (void)ud;
    (void)w;
    g_forgot++;
}

static void engine_forget_reaches_every_rank(void **state)
{
    (void)state;
    kvr_registry *reg = kvr_registry_new();
    kvr_worker *r0 = kvr_registry_add_rank(reg, "http://h:1", 0, 4, NULL, 1);
    for (int r = 1; r < 4; r++)
        kvr_registry_add_rank(reg, "http://h:1", r, 4, NULL, 1);
    kvr_registry_add(reg, "http://h:2", NULL, 1);
    kvr_workers_ctx ctx = {.reg = reg, .unhealthy_threshold = 1, .healthy_threshold = 1,
                           .forget_after_ms = 100, .on_forget = count_forget};
    kvr_worker *ranks[KVR_ENGINE_MAX_RANKS];
    assert_int_equal(kvr_engine_ranks(&ctx, r0, ranks), 4);
    g_forgot = 0;
    kvr_health_apply(&ctx, r0, 0, 1000);
    kvr_health_apply(&ctx, r0, 0, 2000); /* down 1 s > 100 ms: forgotten, every rank */
    assert_int_equal(g_forgot, 4);
    kvr_registry_free(reg);
}

static const char LABELLED[] =
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 5\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 7\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n"
    "process_start_time_seconds 1700000000\n";

static void scrape_splits_by_engine_label(void **state)
{
    (void)state;
    kvr_scrape_result r;
    kvr_scrape_parse_rank(LABELLED, sizeof(LABELLED) - 1, 1, 2, &r);
    assert_true(r.running == 5 && r.waiting == 7 && r.kv_usage == 0.75);
    assert_true(r.start_time == 1700000000);
    kvr_scrape_parse_rank(LABELLED, sizeof(LABELLED) - 1, 0, 2, &r);
    assert_true(r.running == 3 && r.waiting == 1 && r.kv_usage == 0.25);
    kvr_scrape_parse_rank(LABELLED, sizeof(LABELLED) - 1, 3, 4, &r); /* no series for it */
    assert_true(r.running == -1 && r.waiting == -1);
    kvr_scrape_parse(LABELLED, sizeof(LABELLED) - 1, &r); /* a plain worker: the sums */
    assert_true(r.running == 8 && r.waiting == 8 && r.kv_usage == 0.75);
    static const char PLAIN[] = "vllm:num_requests_running 8\nvllm:num_requests_waiting 4\n"
                                "vllm:kv_cache_usage_perc 0.5\n";
    kvr_scrape_parse_rank(PLAIN, sizeof(PLAIN) - 1, 1, 4, &r); /* shared evenly */
    assert_true(r.running == 2 && r.waiting == 1 && r.kv_usage == 0.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_only_a_trailing_number),
        cmocka_unit_test(cli_worker_expands_into_ranks),
        cmocka_unit_test(file_ranks_targets_and_event_ports),
        cmocka_unit_test(file_errors),
        cmocka_unit_test(ranks_share_health_and_breaker_not_load),
        cmocka_unit_test(readd_relinks_to_the_current_rank0),
        cmocka_unit_test(engine_forget_reaches_every_rank),
        cmocka_unit_test(scrape_splits_by_engine_label),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
