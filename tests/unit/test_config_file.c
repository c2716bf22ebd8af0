/* The YAML config file loader: a full file lands in the struct exactly; every error is
 * reported once as PATH:LINE:COL with the right position; did-you-mean; syntax errors;
 * unreadable and empty files; types, nulls, bounds and the shapes of each section. */
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
#include "routing/scorers.h"

static loaded *load(const char *yaml)
{
    return load_with(kvr_config_file_load, yaml);
}

/* Error `i` is exactly "PATH:" followed by `rest`. */
static void assert_error(const loaded *l, size_t i, const char *rest)
{
    char want[1024];
    snprintf(want, sizeof(want), "%s:%s", l->path, rest);
    assert_true(i < l->errs.n);
    assert_string_equal(l->errs.msg[i], want);
}

/* Error `i` starts with "PATH:" followed by `pos` (libyaml's wording is not ours to pin). */
static void assert_error_at(const loaded *l, size_t i, const char *pos)
{
    char want[256];
    snprintf(want, sizeof(want), "%s:%s", l->path, pos);
    assert_true(i < l->errs.n);
    assert_memory_equal(l->errs.msg[i], want, strlen(want));
}

static const char FULL[] =
    "# everything at once\n"
    "listen:\n"
    "  host: 0.0.0.0\n"
    "  port: 8080\n"
    "admin:\n"
    "  host: 127.0.0.2\n"
    "  port: 9090\n"
    "  token_file: /etc/kvroute/token\n"
    "defaults:\n"
    "  policy: round_robin\n"
    "  cache_threshold: 0.25\n"
    "log_level: debug\n"
    "max_body_bytes: 1048576\n"
    "workers:\n"
    "  - http://127.0.0.1:9001\n"
    "  - url: http://127.0.0.1:9002\n"
    "    name: gpu2\n"
    "    weight: 2.5\n"
    "routes:\n"
    "  - name: llama\n"
    "    aliases: [llama-3, meta/llama]\n"
    "    session_ttl: 600\n"
    "    policy: cache_aware\n"
    "    targets:\n"
    "      - http://127.0.0.1:9001\n"
    "      - {worker: gpu2, model: llama-3-8b, weight: 3}\n"
    "  - model: qwen\n"
    "    aliases: qwen2\n"
    "    targets: [gpu2]\n";

static void full_file(void **state)
{
    (void)state;
    loaded *l = load(FULL);
    kvr_config *c = &l->c;
    kvr_errlist_print(&l->errs, stderr, "unexpected: ");
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->errs.n, 0);

    assert_string_equal(c->host, "0.0.0.0");
    assert_int_equal(c->port, 8080);
    assert_string_equal(c->admin_host, "127.0.0.2");
    assert_int_equal(c->admin_port, 9090);
    assert_string_equal(c->admin_token_file, "/etc/kvroute/token");
    assert_string_equal(c->route.policy, "round_robin");
    assert_true(c->route.p.cache_threshold == 0.25);
    assert_int_equal(c->route.p.session_ttl_s, 3600); /* a route's own key is not a default */
    assert_string_equal(c->log_level, "debug");
    assert_int_equal(c->http.max_body_bytes, 1048576);

    assert_int_equal(c->nworkers, 2);
    assert_string_equal(c->workers[0].url, "http://127.0.0.1:9001");
    assert_string_equal(c->workers[0].name, "http://127.0.0.1:9001");
    assert_true(c->workers[0].weight == 1);
    assert_int_equal(c->workers[0].line, 15);
    assert_int_equal(c->workers[0].col, 5);
    assert_string_equal(c->workers[1].url, "http://127.0.0.1:9002");
    assert_string_equal(c->workers[1].name, "gpu2");
    assert_true(c->workers[1].weight == 2.5);
    assert_int_equal(c->workers[1].line, 16);
    assert_int_equal(c->workers[1].col, 5);

    assert_int_equal(c->nroutes, 2);
    const kvr_route_spec *r = &c->routes[0];
    assert_string_equal(r->name, "llama");
    assert_int_equal(r->line, 20);
    assert_int_equal(r->col, 5);
    assert_int_equal(r->naliases, 2);
    assert_string_equal(r->aliases[0], "llama-3");
    assert_string_equal(r->aliases[1], "meta/llama");
    assert_int_equal(r->nsettings, 2);
    assert_string_equal(r->settings[0].key, "session_ttl");
    assert_string_equal(r->settings[0].value, "600");
    assert_int_equal(r->settings[0].line, 22);
    assert_int_equal(r->settings[0].col, 18);
    assert_string_equal(r->settings[1].key, "policy");
    assert_string_equal(r->settings[1].value, "cache_aware");
    assert_int_equal(r->ntargets, 2);
    assert_string_equal(r->targets[0].worker, "http://127.0.0.1:9001");
    assert_null(r->targets[0].model);
    assert_true(r->targets[0].weight == 0);
    assert_int_equal(r->targets[0].line, 25);
    assert_int_equal(r->targets[0].col, 9);
    assert_string_equal(r->targets[1].worker, "gpu2");
    assert_string_equal(r->targets[1].model, "llama-3-8b");
    assert_true(r->targets[1].weight == 3);
    assert_int_equal(r->targets[1].line, 26);
    assert_int_equal(r->targets[1].col, 9);

    r = &c->routes[1];
    assert_string_equal(r->name, "qwen");
    assert_int_equal(r->line, 27);
    assert_int_equal(r->naliases, 1);
    assert_string_equal(r->aliases[0], "qwen2");
    assert_int_equal(r->nsettings, 0);
    assert_int_equal(r->ntargets, 1);
    assert_string_equal(r->targets[0].worker, "gpu2");
    assert_int_equal(r->targets[0].line, 29);
    assert_int_equal(r->targets[0].col, 15);
    done(l);
}

/* Exactly the three problems, each once, in file order, at the offending token. */
static void three_errors(void **state)
{
    (void)state;
    loaded *l = load("listen:\n"
                     "  host: 0.0.0.0\n"
                     "  port: [8080]\n"
                     "lisen:\n"
                     "  port: 1\n"
                     "seed: 1\n"
                     "seed: 2\n");
    assert_int_equal(l->rc, -1);
    assert_int_equal(l->errs.n, 3);
    assert_error(l, 0, "3:9: port: expected a scalar");
    assert_error(l, 1, "4:1: unknown key 'lisen' (did you mean 'listen'?)");
    assert_error(l, 2, "7:1: duplicate key 'seed' (first at line 6)");
    assert_int_equal(l->c.seed, 1); /* the duplicate is not applied */
    done(l);
}

static void bad_values(void **state)
{
    (void)state;
    loaded *l = load("listen: {port: x}\n"
                     "admin: {port: 70000}\n"
                     "defaults: {policy: nope, cache_threshold: 2}\n"
                     "check: true\n"
                     "config: other.yaml\n"
                     "worker: http://h\n"
                     "max-body-bytes: 10\n"
                     "health_path:\n"
                     "zzzzzz: 1\n");
    assert_int_equal(l->rc, -1);
    assert_int_equal(l->errs.n, 10);
    assert_error(l, 0, "1:16: port: bad value 'x' (expected an integer in [1, 65535])");
    assert_error(l, 1, "2:15: port: bad value '70000' (expected an integer in [0, 65535])");
    char want[512];
    snprintf(want, sizeof(want), "3:20: policy: unknown policy 'nope' (one of %s)",
             kvr_policy_names());
    assert_error(l, 2, want);
    assert_error(l, 3, "3:43: cache_threshold: bad value '2' (expected a number in [0, 1])");
    assert_error(l, 4, "4:1: check: only on the command line");
    assert_error(l, 5, "5:1: config: only on the command line");
    assert_error(l, 6, "6:1: worker: only on the command line (use `workers:` in a file)");
    assert_error(l, 7, "7:1: unknown key 'max-body-bytes' (did you mean 'max_body_bytes'?)");
    assert_error(l, 8, "8:13: health_path: expected a value");
    assert_error(l, 9, "9:1: unknown key 'zzzzzz'"); /* nothing close: no suggestion */
    assert_string_equal(l->c.route.policy, "cache_aware"); /* a bad value is not applied */
    done(l);
}

/* hash_load_factor: a route setting (default 1.25, `defaults:` and per route; 0 = unbounded). */
static void hash_load_factor(void **state)
{
    (void)state;
    loaded *l = load("defaults: {hash_load_factor: 2}\n");
    assert_int_equal(l->rc, 0);
    assert_true(l->c.route.p.hash_load_factor == 2);
    done(l);
    l = load("defaults: {policy: consistent_hash}\n");
    assert_true(l->c.route.p.hash_load_factor == 1.25);
    done(l);
    l = load("defaults: {hash_load_factor: -1}\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "1:30: hash_load_factor: bad value '-1' (expected a number in [0, "
                       "1e+06])");
    done(l);
    l = load("workers: [http://127.0.0.1:9001]\n"
             "routes:\n"
             "  - {name: m, policy: rendezvous_hash, hash_load_factor: 0, targets: "
             "[http://127.0.0.1:9001]}\n");
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->c.routes[0].nsettings, 2);
    assert_string_equal(l->c.routes[0].settings[1].key, "hash_load_factor");
    assert_string_equal(l->c.routes[0].settings[1].value, "0");
    done(l);
}

static void shapes(void **state)
{
    (void)state;
    loaded *l = load("workers:\n"
                     "  - {name: a}\n"
                     "  - [x]\n"
                     "  - {url: http://h, weight: 0, wieght: 1}\n"
                     "routes:\n"
                     "  - targets: [a]\n"
                     "  - name: m\n"
                     "    model: n\n"
                     "  - name: ok\n"
                     "    aliases: {a: b}\n"
                     "    targets: [{model: x}, {worker: w, weight: -1}]\n"
                     "    cache_treshold: 0.5\n"
                     "  - 7\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "2:5: worker: missing 'url'");
    assert_error(l, 1, "3:5: workers: expected a URL or a mapping");
    assert_error(l, 2, "4:29: weight: bad value '0' (expected a number > 0)");
    assert_error(l, 3, "4:32: unknown key 'wieght' (did you mean 'weight'?)");
    assert_error(l, 4, "6:5: route: missing 'name' (or 'model')");
    assert_error(l, 5, "8:12: model: 'n' differs from name 'm' (give one of them)");
    assert_error(l, 6, "10:14: aliases: expected a name or a list of names");
    assert_error(l, 7, "11:15: target: missing 'worker'");
    assert_error(l, 8, "11:47: weight: bad value '-1' (expected a number > 0)");
    assert_error(l, 9, "12:5: unknown key 'cache_treshold' (did you mean 'cache_threshold'?)");
    assert_error(l, 10, "13:5: routes: expected a mapping");
    assert_int_equal(l->errs.n, 11);
    /* What is kept is well formed: entries without their required key are dropped. */
    assert_int_equal(l->c.nworkers, 1);
    assert_string_equal(l->c.workers[0].name, "http://h");
    assert_int_equal(l->c.nroutes, 1);
    assert_string_equal(l->c.routes[0].name, "ok");
    assert_int_equal(l->c.routes[0].ntargets, 1);
    assert_string_equal(l->c.routes[0].targets[0].worker, "w");
    done(l);

    l = load("- a\n- b\n");
    assert_error(l, 0, "1:1: expected a mapping at the top level");
    done(l);
    l = load("workers: http://h\nroutes:\nlisten: ~\n");
    assert_error(l, 0, "1:10: workers: expected a list");
    assert_error(l, 1, "2:8: routes: expected a value");
    assert_error(l, 2, "3:9: listen: expected a value");
    assert_int_equal(l->errs.n, 3);
    done(l);
}

static void yaml_values(void **state)
{
    (void)state;
    /* Quoted strings; numbers are read from the text (exactly when they are digits). */
    loaded *l = load("listen: {host: '::1', port: \"8001\"}\n"
                     "seed: 18000000000000000001\n"
                     "discovery_interval: 1e2\n"
                     "policy: least_load\n"
                     "---\n"
                     "port: 1\n");
    assert_int_equal(l->errs.n, 1);
    assert_error(l, 0, "6:1: only one YAML document is allowed");
    assert_string_equal(l->c.host, "::1");
    assert_int_equal(l->c.port, 8001);
    assert_true(l->c.seed == 18000000000000000001u);
    assert_int_equal(l->c.discovery_interval_s, 100);
    assert_string_equal(l->c.route.policy, "least_load");
    done(l);
}

static void syntax_error(void **state)
{
    (void)state;
    loaded *l = load("listen:\n  host: x\n port: 1\n");
    assert_int_equal(l->rc, -1);
    assert_int_equal(l->errs.n, 1);
    assert_error_at(l, 0, "3:2: ");
    done(l);

    l = load("a: \"unterminated\n");
    assert_int_equal(l->errs.n, 1);
    assert_error_at(l, 0, "2:1: ");
    done(l);

    l = load("seed: \xff\n"); /* not UTF-8: the reader reports a byte offset */
    assert_int_equal(l->errs.n, 1);
    assert_error_at(l, 0, "1:7: ");
    done(l);
}

static void unreadable_and_empty(void **state)
{
    (void)state;
    kvr_config c;
    kvr_errlist e = {0};
    kvr_config_default(&c);
    assert_int_equal(kvr_config_file_load(&c, "/nonexistent/kvr.yaml", &e), -1);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.msg[0], "/nonexistent/kvr.yaml:0:0: cannot read: No such file or directory");
    kvr_errlist_free(&e);
    assert_int_equal(kvr_config_file_load(&c, "/tmp", &e), -1);
    assert_string_equal(e.msg[0], "/tmp:0:0: cannot read: Is a directory");
    kvr_errlist_free(&e);
    kvr_config_free(&c);

    const char *const empty[] = {"", "# only a comment\n", "---\n", "~\n"};
    for (size_t i = 0; i < sizeof(empty) / sizeof(empty[0]); i++) {
        loaded *l = load(empty[i]);
        assert_int_equal(l->rc, 0);
        assert_int_equal(l->errs.n, 0);
        assert_int_equal(l->c.nworkers, 0);
        assert_int_equal(l->c.nroutes, 0);
        assert_int_equal(l->c.port, 8000);
        done(l);
    }
}

/* Errors of an earlier call stay; the result counts only this call's. Workers append. */
static void appends(void **state)
{
    (void)state;
    loaded *l = load("workers: [http://a, http://b]\n");
    assert_int_equal(l->rc, 0);
    kvr_errlist_add(&l->errs, "earlier");
    assert_int_equal(kvr_config_file_load(&l->c, l->path, &l->errs), 0);
    assert_int_equal(l->c.nworkers, 4);
    assert_string_equal(l->c.workers[0].url, "http://a");
    assert_string_equal(l->c.workers[3].url, "http://b");
    assert_int_equal(l->errs.n, 1);
    done(l);
}

/* Worker lists (the file's and each route's targets) are capped like --worker. */
static void caps(void **state)
{
    (void)state;
    size_t cap = 64 + 40 * (KVR_MAX_WORKERS + 1);
    char *yaml = malloc(cap), *p = yaml;
    p += sprintf(p, "workers:\n");
    for (int i = 0; i <= KVR_MAX_WORKERS; i++)
        p += sprintf(p, "  - http://127.0.0.1:%d\n", 10000 + i);
    loaded *l = load(yaml);
    free(yaml);
    assert_int_equal(l->c.nworkers, KVR_MAX_WORKERS);
    assert_int_equal(l->errs.n, 1);
    char want[64];
    snprintf(want, sizeof(want), "%d:5: workers: too many (max %d)", KVR_MAX_WORKERS + 2,
             KVR_MAX_WORKERS);
    assert_error(l, 0, want);
    done(l);
}

/* A self-referencing alias cannot make the loader loop. */
static void cyclic_alias(void **state)
{
    (void)state;
    loaded *l = load("routes: &r\n  - name: a\n    targets: *r\n");
    assert_int_equal(l->rc, -1);
    /* The route is read again as its own target: wrong keys, reported, and done. */
    assert_error(l, 0, "2:5: unknown key 'name'");
    assert_error(l, 1, "3:5: unknown key 'targets'");
    assert_error(l, 2, "2:5: target: missing 'worker'");
    assert_int_equal(l->errs.n, 3);
    assert_int_equal(l->c.nroutes, 1);
    assert_int_equal(l->c.routes[0].ntargets, 0);
    done(l);
}

/* Client auth, egress, rate limits, admission limits and a worker's own key and cap. */
static const char SECURITY[] = "auth:\n"
                               "  api_keys_file: /etc/kvroute/keys\n"
                               "metrics_require_key: true\n"
                               "max_inflight: 64\n"
                               "max_queue: 100\n"
                               "queue_timeout_ms: 5000\n"
                               "max_connections_per_ip: 16\n"
                               "egress:\n"
                               "  allow: [10.0.0.0/8, \"*.internal\"]\n"
                               "  deny: 169.254.169.254\n"
                               "rate_limits:\n"
                               "  alice: {requests_per_minute: 60, tokens_per_minute: 100000}\n"
                               "  \"bob\":\n"
                               "    tokens_per_minute: 1000000000000\n"
                               "  carol: {}\n"
                               "workers:\n"
                               "  - url: http://127.0.0.1:9001\n"
                               "    api_key_file: /etc/kvroute/w1.key\n"
                               "    max_inflight: 4\n"
                               "  - {url: http://127.0.0.1:9002, api_key_env: W2_KEY}\n"
                               "  - http://127.0.0.1:9003\n";

static void security_file(void **state)
{
    (void)state;
    loaded *l = load(SECURITY);
    kvr_config *c = &l->c;
    kvr_errlist_print(&l->errs, stderr, "unexpected: ");
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->errs.n, 0);

    assert_string_equal(c->api_key_file, "/etc/kvroute/keys");
    assert_int_equal(c->metrics_require_key, 1);
    assert_int_equal(c->max_inflight, 64);
    assert_int_equal(c->max_queue, 100);
    assert_int_equal(c->queue_timeout_ms, 5000);
    assert_int_equal(c->http.max_connections_per_ip, 16);

    assert_int_equal(c->egress_line, 8);
    assert_int_equal(c->egress_col, 1);
    assert_int_equal(c->negress_allow, 2);
    assert_string_equal(c->egress_allow[0], "10.0.0.0/8");
    assert_string_equal(c->egress_allow[1], "*.internal");
    assert_int_equal(c->negress_deny, 1); /* one scalar: a list of one */
    assert_string_equal(c->egress_deny[0], "169.254.169.254");

    assert_int_equal(c->nrate_limits, 3);
    const kvr_rate_limit_spec *r = c->rate_limits;
    assert_string_equal(r[0].key, "alice");
    assert_true(r[0].requests_per_minute == 60);
    assert_true(r[0].tokens_per_minute == 100000);
    assert_int_equal(r[0].line, 12);
    assert_int_equal(r[0].col, 3);
    assert_string_equal(r[1].key, "bob");
    assert_true(r[1].requests_per_minute == 0);
    assert_true(r[1].tokens_per_minute == 1000000000000u);
    assert_int_equal(r[1].line, 13);
    assert_int_equal(r[1].col, 3);
    assert_string_equal(r[2].key, "carol");
    assert_true(r[2].requests_per_minute == 0 && r[2].tokens_per_minute == 0);
    assert_int_equal(r[2].line, 15);

    assert_int_equal(c->nworkers, 3);
    assert_string_equal(c->workers[0].api_key_file, "/etc/kvroute/w1.key");
    assert_null(c->workers[0].api_key_env);
    assert_int_equal(c->workers[0].max_inflight, 4);
    assert_null(c->workers[1].api_key_file);
    assert_string_equal(c->workers[1].api_key_env, "W2_KEY");
    assert_int_equal(c->workers[1].max_inflight, 0);
    assert_null(c->workers[2].api_key_file);
    assert_null(c->workers[2].api_key_env);
    assert_int_equal(c->workers[2].max_inflight, 0);
    done(l);

    /* Nothing written: nothing set. */
    l = load("seed: 1\n");
    assert_null(l->c.api_key_file);
    assert_int_equal(l->c.negress_allow + l->c.negress_deny + l->c.nrate_limits, 0);
    assert_int_equal(l->c.egress_line, 0);
    done(l);
}

static void security_errors(void **state)
{
    (void)state;
    loaded *l = load("workers:\n"
                     "  - {url: http://a, max_inflight: -1}\n"
                     "  - {url: http://b, max_inflight: 1.5, api_key_fil: f}\n"
                     "  - {url: http://c, api_key_file: f, api_key_env: E, max_inflight: ''}\n"
                     "egress:\n"
                     "  alow: [x]\n"
                     "  deny: {a: b}\n"
                     "  allow: ['', ok, [n]]\n"
                     "rate_limits:\n"
                     "  alice: {requests_per_minute: 10, token_per_minute: 5}\n"
                     "  alice: {}\n"
                     "  bob: ~\n"
                     "  carol: {requests_per_minute: 1e13, tokens_per_minute: x, rpm: 1}\n"
                     "  '': {}\n"
                     "api_key_file: /etc/keys\n"
                     "auth: {api_key_file: /x}\n"
                     "rate_limit: {}\n"
                     "egress: {}\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "2:35: max_inflight: bad value '-1' (expected an integer in [0, 1e+09])");
    assert_error(l, 1, "3:35: max_inflight: bad value '1.5' (expected an integer in [0, 1e+09])");
    assert_error(l, 2, "3:40: unknown key 'api_key_fil' (did you mean 'api_key_file'?)");
    assert_error(l, 3, "4:38: api_key_env: give api_key_file or api_key_env, not both");
    assert_error(l, 4, "4:68: max_inflight: bad value '' (expected an integer in [0, 1e+09])");
    assert_error(l, 5, "6:3: unknown key 'alow' (did you mean 'allow'?)");
    assert_error(l, 6, "7:9: deny: expected a CIDR, IP or host glob, or a list of them");
    assert_error(l, 7, "8:11: allow: expected a value");
    assert_error(l, 8, "8:19: allow: expected a scalar");
    assert_error(l, 9, "10:36: unknown key 'token_per_minute' (did you mean 'tokens_per_minute'?)");
    assert_error(l, 10, "11:3: duplicate key 'alice' (first at line 10)");
    assert_error(l, 11, "12:8: bob: expected a value");
    assert_error(l, 12, "13:32: requests_per_minute: bad value '1e13' (expected an integer in "
                        "[0, 1e+12])");
    assert_error(l, 13, "13:57: tokens_per_minute: bad value 'x' (expected an integer in "
                        "[0, 1e+12])");
    assert_error(l, 14, "13:60: unknown key 'rpm'");
    assert_error(l, 15, "14:3: rate_limits: expected a key name");
    assert_error(l, 16, "15:1: api_key_file: not a top-level key (client keys: use "
                        "auth.api_keys_file)");
    assert_error(l, 17, "16:8: unknown key 'api_key_file' (did you mean 'api_keys_file'?)");
    assert_error(l, 18, "17:1: unknown key 'rate_limit' (did you mean 'rate_limits'?)");
    assert_error(l, 19, "18:1: duplicate key 'egress' (first at line 5)");
    assert_int_equal(l->errs.n, 20);
    /* Nothing refused was applied; what is kept is well formed. */
    assert_null(l->c.api_key_file);
    assert_int_equal(l->c.nworkers, 3);
    assert_int_equal(l->c.workers[0].max_inflight, 0);
    assert_string_equal(l->c.workers[2].api_key_file, "f");
    assert_null(l->c.workers[2].api_key_env);
    assert_int_equal(l->c.negress_allow, 1);
    assert_string_equal(l->c.egress_allow[0], "ok");
    assert_int_equal(l->c.negress_deny, 0);
    assert_int_equal(l->c.nrate_limits, 2);
    assert_string_equal(l->c.rate_limits[0].key, "alice");
    assert_true(l->c.rate_limits[0].requests_per_minute == 10);
    assert_string_equal(l->c.rate_limits[1].key, "carol");
    done(l);

    /* Section shapes. */
    l = load("auth: /etc/keys\negress: [x]\nrate_limits: [a]\n");
    assert_error(l, 0, "1:7: auth: expected a mapping");
    assert_error(l, 1, "2:9: egress: expected a mapping");
    assert_error(l, 2, "3:14: rate_limits: expected a mapping");
    assert_int_equal(l->errs.n, 3);
    assert_int_equal(l->c.egress_line, 2); /* the section's position even when refused */
    done(l);
}

/* A worker's `lmcache: {endpoint}` and its errors; the interval is a top-level key. */
static void lmcache_file(void **state)
{
    (void)state;
    loaded *l = load("lmcache_interval_ms: 250\n"
                     "workers:\n"
                     "  - url: http://127.0.0.1:9001\n"
                     "    lmcache: {endpoint: \"http://127.0.0.1:9001/lmcache/status\"}\n"
                     "  - http://127.0.0.1:9002\n");
    kvr_errlist_print(&l->errs, stderr, "unexpected: ");
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->c.lmcache_interval_ms, 250);
    assert_string_equal(l->c.workers[0].lmcache_endpoint, "http://127.0.0.1:9001/lmcache/status");
    assert_null(l->c.workers[1].lmcache_endpoint);
    done(l);

    l = load("lmcache_interval_ms: 5\n"
             "workers:\n"
             "  - {url: http://a, lmcache: {endpont: http://a/s}}\n"
             "  - {url: http://b, lmcache: http://b/s}\n"
             "  - {url: http://c, lmcache: {endpoint: [x]}}\n"
             "  - {url: http://d, lmcahce: {endpoint: http://d/s}}\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "1:22: lmcache_interval_ms: bad value '5' (expected an integer in "
                       "[10, 3.6e+06])");
    assert_error(l, 1, "3:31: unknown key 'endpont' (did you mean 'endpoint'?)");
    assert_error(l, 2, "3:21: lmcache: missing 'endpoint'");
    assert_error(l, 3, "4:30: lmcache: expected a mapping");
    assert_error(l, 4, "5:41: endpoint: expected a scalar");
    assert_error(l, 5, "5:21: lmcache: missing 'endpoint'");
    assert_error(l, 6, "6:21: unknown key 'lmcahce' (did you mean 'lmcache'?)");
    assert_int_equal(l->errs.n, 7);
    done(l);
}

/* Prefill/decode disaggregation: a worker's role and bootstrap_port, a route's `pd` mapping
 * (kept as its pd_mode, pd_prefill_policy and pd_decode_policy settings). */
static void pd_file(void **state)
{
    (void)state;
    loaded *l = load("workers:\n"
                     "  - {url: http://127.0.0.1:9001, role: prefill, bootstrap_port: 9100}\n"
                     "  - {url: http://127.0.0.1:9002, role: decode}\n"
                     "  - http://127.0.0.1:9003\n"
                     "routes:\n"
                     "  - name: m\n"
                     "    pd: {mode: sglang, decode_policy: round_robin}\n"
                     "    targets: [http://127.0.0.1:9001, http://127.0.0.1:9002]\n");
    kvr_errlist_print(&l->errs, stderr, "unexpected: ");
    assert_int_equal(l->rc, 0);
    assert_int_equal(l->c.workers[0].role, KVR_ROLE_PREFILL);
    assert_int_equal(l->c.workers[0].bootstrap_port, 9100);
    assert_int_equal(l->c.workers[1].role, KVR_ROLE_DECODE);
    assert_int_equal(l->c.workers[2].role, KVR_ROLE_BOTH);
    const kvr_route_spec *r = &l->c.routes[0];
    assert_int_equal(r->nsettings, 2);
    assert_string_equal(r->settings[0].key, "pd_mode");
    assert_string_equal(r->settings[0].value, "sglang");
    assert_string_equal(r->settings[1].key, "pd_decode_policy");
    assert_string_equal(r->settings[1].value, "round_robin");
    done(l);

    l = load("defaults: {pd: {mode: sglang, prefill_policy: round_robin}}\n"
             "workers: [http://a]\n");
    kvr_errlist_print(&l->errs, stderr, "unexpected: ");
    assert_int_equal(l->rc, 0);
    assert_string_equal(l->c.route.pd_mode, "sglang");
    assert_string_equal(l->c.route.prefill_policy, "round_robin");
    assert_string_equal(l->c.route.decode_policy, "least_load");
    done(l);

    l = load("workers:\n"
             "  - {url: http://a, role: prefil}\n"
             "  - {url: http://b, bootstrap_port: 0}\n"
             "routes:\n"
             "  - {name: m, pd: {mdoe: vllm}, targets: [http://a]}\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "2:27: role: 'prefil' (one of prefill, decode, both)");
    assert_error(l, 1, "3:37: bootstrap_port: bad value '0' (expected an integer in [1, "
                       "65535])");
    assert_error(l, 2, "5:20: unknown key 'mdoe' (did you mean 'mode'?)");
    assert_int_equal(l->errs.n, 3);
    done(l);
}

/* pipeline `scorers`: a mapping per route, in `defaults` or at the top level, that replaces the
 * default weights entirely; --scorer NAME=WEIGHT (repeatable) on the command line, whose first
 * one replaces the file's. */
static void scorers(void **state)
{
    (void)state;
    static const char yaml[] = "workers: [http://127.0.0.1:9001]\n"
                               "defaults: {scorers: {prefix: 2, queue: 1.5}}\n"
                               "routes:\n"
                               "  - {name: a, policy: pipeline, targets: [http://127.0.0.1:9001],\n"
                               "     scorers: {load: 1}}\n"
                               "  - {name: b, policy: pipeline, targets: [http://127.0.0.1:9001]}\n";
    loaded *l = load(yaml);
    assert_int_equal(l->rc, 0);
    assert_true(l->c.route.p.scorers[KVR_SCORER_PREFIX] == 2 &&
                l->c.route.p.scorers[KVR_SCORER_QUEUE] == 1.5 &&
                l->c.route.p.scorers[KVR_SCORER_SESSION] == 0);
    assert_string_equal(l->c.routes[0].settings[1].key, "scorers");
    assert_string_equal(l->c.routes[0].settings[1].value, "load=1");
    done(l);
    /* Resolved: route a has load alone, route b the file's defaults; then --scorer replaces
     * the defaults (not a route's own map) and adds up when repeated. */
    for (int cli = 0; cli < 2; cli++) {
        l = load(yaml);
        kvr_config_free(&l->c);
        kvr_config_default(&l->c);
        char *argv[] = {"kvroute", "--config", l->path, "--scorer", "weight=3", "--scorer",
                        "session=1"};
        assert_int_equal(kvr_config_load(&l->c, cli ? 7 : 3, argv, &l->errs), 0);
        const double *a = l->c.routes[0].cfg.p.scorers, *b = l->c.routes[1].cfg.p.scorers;
        for (int s = 0; s < KVR_NSCORERS; s++)
            assert_true(a[s] == (s == KVR_SCORER_LOAD ? 1 : 0));
        assert_true(b[KVR_SCORER_PREFIX] == (cli ? 0 : 2));
        assert_true(b[KVR_SCORER_WEIGHT] == (cli ? 3 : 0));
        assert_true(b[KVR_SCORER_SESSION] == (cli ? 1 : 0));
        done(l);
    }
    /* The top level sets the route defaults too; an empty map weighs every scorer 0. */
    l = load("scorers: {lmcache: 1}\n");
    assert_int_equal(l->rc, 0);
    assert_true(l->c.route.p.scorers[KVR_SCORER_LMCACHE] == 1 &&
                l->c.route.p.scorers[KVR_SCORER_PREFIX] == 0);
    done(l);
    l = load("defaults: {scorers: {}}\n");
    assert_int_equal(l->rc, 0);
    for (int s = 0; s < KVR_NSCORERS; s++)
        assert_true(l->c.route.p.scorers[s] == 0);
    done(l);
    /* Errors at their positions. */
    l = load("defaults:\n"
             "  scorers: {lod: 1, load: -2, weight: [1]}\n"
             "scorer: load=1\n");
    assert_int_equal(l->rc, -1);
    assert_error(l, 0, "2:13: scorers: unknown scorer 'lod' (one of prefix, session, load, "
                       "queue, kv_usage, weight, lmcache)");
    assert_error(l, 1, "2:27: scorers: load: bad weight '-2' (expected a number 0..1e6)");
    assert_error(l, 2, "2:39: weight: expected a scalar");
    assert_error(l, 3, "3:1: scorer: only on the command line");
    assert_int_equal(l->errs.n, 4);
    done(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_file),   cmocka_unit_test(three_errors),
        cmocka_unit_test(bad_values),  cmocka_unit_test(shapes),
        cmocka_unit_test(hash_load_factor), cmocka_unit_test(scorers),
        cmocka_unit_test(yaml_values), cmocka_unit_test(syntax_error),
        cmocka_unit_test(unreadable_and_empty), cmocka_unit_test(appends),
        cmocka_unit_test(caps),        cmocka_unit_test(cyclic_alias),
        cmocka_unit_test(security_file), cmocka_unit_test(security_errors),
        cmocka_unit_test(lmcache_file), cmocka_unit_test(pd_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
