/* kvroute: flags and config → start the loop. */
#include <malloc.h>
#include <unistd.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "api/admin.h"
#include "api/auth.h"
#include "proxy/admission.h"
#include "proxy/ratelimit.h"
#include "upstream/egress.h"
#include "api/router.h"
#include "proxy/proxy.h"
#include "app/app.h"
#include "events/kvevents.h"
#include "obs/access_log.h"
#include "cluster/cluster.h"
#include "obs/otlp.h"
#include "obs/status_stats.h"
#include "proxy/tokenize.h"
#include "routing/text_scan.h"
#include "util/log.h"
#include "util/rand.h"
#include "util/time.h"
#include "workers/discovery.h"
#include "workers/fetch.h"
#include "workers/health.h"
#include "workers/k8s.h"
#include "workers/lmcache.h"
#include "workers/scrape.h"

static kvr_app g_app;
static uv_signal_t g_sigterm, g_sigint, g_sighup, g_sigusr1;
static uv_timer_t g_drain_timer, g_sweep_timer, g_breaker_timer, g_delay_timer;
static kvr_http_server *g_admin;
static uint64_t g_drain_deadline_ms;
static int g_requests_ended;

static void on_http_closed(void *ud)
{
    kvr_app *app = ud;
    kvr_fetch_cancel_all();
    kvr_tokenizer_free(app->tokenizer);
    app->tokenizer = NULL;
    /* No request is left to route: the KV block index can go. */
    kvr_kv_events_close(app->kv);
    app->kv = NULL;
    kvr_otlp_close(app->otlp);
    app->otlp = NULL;
    kvr_cluster_close(app->cluster);
    app->cluster = NULL;
    /* Every request has ended: its access-log line is buffered; write it and close. */
    kvr_access_log_close(app->access);
    app->access = NULL;
    kvr_upstream_close(app->up);
}

static void shutdown_all(void)
{
    kvr_app *app = &g_app;
    uv_timer_stop(&g_drain_timer);
    uv_close((uv_handle_t *)&g_drain_timer, NULL);
    uv_timer_stop(&g_delay_timer);
    uv_close((uv_handle_t *)&g_delay_timer, NULL);
    uv_timer_stop(&g_sweep_timer);
    uv_close((uv_handle_t *)&g_sweep_timer, NULL);
    uv_timer_stop(&g_breaker_timer);
    uv_close((uv_handle_t *)&g_breaker_timer, NULL);
    kvr_proxy_stop(app);
    kvr_scrape_stop();
    kvr_lmcache_stop();
    kvr_discovery_stop();
    kvr_k8s_stop(app->k8s);
    app->k8s = NULL;
    if (g_admin)
        kvr_http_server_close(g_admin, NULL, NULL);
    uv_close((uv_handle_t *)&g_sigterm, NULL);
    uv_close((uv_handle_t *)&g_sigint, NULL);
    uv_close((uv_handle_t *)&g_sighup, NULL);
    uv_close((uv_handle_t *)&g_sigusr1, NULL);
    kvr_health_stop();
    /* The upstream client goes last: closing client connections cancels their attempts. */
    kvr_http_server_close(app->http, on_http_closed, app);
}

static void drain_tick(uv_timer_t *t)
{
    (void)t;
    size_t active = kvr_http_server_active_requests(g_app.http);
    /* Done when every connection has flushed its last response and closed, not merely when
     * the last request left the handler: its final bytes may still be queued. */
    size_t open = kvr_http_server_open_connections(g_app.http);
    uint64_t now = kvr_now_ms();
    if (open && now >= g_drain_deadline_ms && !g_requests_ended) {
        /* Tell the remaining clients why, then give their connections a moment to flush. */
        g_requests_ended = 1;
        KVR_WARN("msg=\"drain timeout: ending remaining requests\" active=%zu ended=%zu", active,
                 kvr_proxy_shutdown(&g_app));
        g_drain_deadline_ms = now + 1000;
        return;
    }
    if (open == 0 || now >= g_drain_deadline_ms) {
        KVR_INFO("msg=\"%s\" open=%zu", open ? "closing remaining connections" : "drained",
                 open);
        shutdown_all();
    }
}

/* Expired sessions are dropped lazily on lookup; this bounds how long dead ones hold memory. */
static void sweep_tick(uv_timer_t *t)
{
    (void)t;
    for (size_t i = 0; i < g_app.routes->n; i++)
        kvr_route_sweep(g_app.routes->routes[i], 10000);
    kvr_kv_events_tick(g_app.kv);
}

static void breaker_tick(uv_timer_t *t)
{
    (void)t;
    kvr_app_breaker_tick(&g_app);
}

static void on_sighup(uv_signal_t *s, int signum)
{
    (void)s, (void)signum;
    if (!g_app.cfg.config_file) {
        KVR_WARN("msg=\"SIGHUP: no --config file to reload\"");
        return;
    }
    KVR_INFO("msg=\"SIGHUP: reloading\" file=%s", g_app.cfg.config_file);
    kvr_errlist errs = {0};
    kvr_app_reload(&g_app, &errs);
    kvr_errlist_free(&errs);
}

/* Log rotation: the access log is reopened under its name (kvroute's own log is stderr). */
static void on_sigusr1(uv_signal_t *s, int signum)
{
    (void)s, (void)signum;
    char err[512];
    if (!g_app.access)
        return;
    if (kvr_access_log_reopen(g_app.access, err, sizeof(err)) < 0)
        KVR_WARN("msg=\"SIGUSR1: cannot reopen the access log: the old file stays in use\" "
                 "error=\"%s\"", err);
    else
        KVR_INFO("msg=\"SIGUSR1: access log reopened\" path=%s", g_app.cfg.access_log);
}

/* The drain as before the shutdown delay existed: stop accepting, let requests finish
 * within --drain-timeout, then close everything. */
static void begin_drain(int signum)
{
    KVR_INFO("msg=\"draining\" signal=%d active=%zu timeout_s=%llu", signum,
             kvr_http_server_active_requests(g_app.http),
             (unsigned long long)g_app.cfg.drain_timeout_s);
    g_app.draining = 1;
    kvr_http_server_stop_accepting(g_app.http);
    g_drain_deadline_ms = kvr_now_ms() + g_app.cfg.drain_timeout_s * 1000;
    uv_timer_start(&g_drain_timer, drain_tick, 0, 20);
}

static void delay_done(uv_timer_t *t)
{
    (void)t;
    begin_drain(SIGTERM);
}

/* SIGTERM: /readyz turns 503 at once (app->shutting_down) while everything keeps serving,
 * new connections included, for --shutdown-delay-ms: a Kubernetes Service keeps sending to a
 * terminating pod until its endpoints controller and every kube-proxy or load balancer saw
 * the change, and that takes seconds. Then the drain. SIGINT (an operator's ^C) drains at
 * once; a second signal, in the delay or the drain, stops now. */
static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    if (g_app.draining || g_app.shutting_down) {
        KVR_WARN("msg=\"second signal: stopping now\"");
        g_drain_deadline_ms = 0;
        if (!g_app.draining) {
            uv_timer_stop(&g_delay_timer);
            begin_drain(signum);
            g_drain_deadline_ms = 0;
        }
        return;
    }
    g_app.shutting_down = 1;
    if (signum == SIGTERM && g_app.cfg.shutdown_delay_ms > 0) {
        KVR_INFO("msg=\"shutting down: not ready, serving until the delay ends\" signal=%d "
                 "delay_ms=%llu active=%zu",
                 signum, (unsigned long long)g_app.cfg.shutdown_delay_ms,
                 kvr_http_server_active_requests(g_app.http));
        uv_timer_start(&g_delay_timer, delay_done, g_app.cfg.shutdown_delay_ms, 0);
        return;
    }
    begin_drain(signum);
}

/* The admin token file must be readable and the access log's place writable (--check). */
static int check_runtime_files(kvr_app *app, kvr_errlist *errs)
{
    char err[512];
    size_t before = errs->n;
    if (kvr_admin_load_token(app, err, sizeof(err)) < 0)
        kvr_errlist_add(errs, "%s", err);
    const char *log = app->cfg.access_log;
    if (log && strcmp(log, "-") != 0) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", log);
        char *slash = strrchr(dir, '/');
        if (slash)
            *(slash == dir ? slash + 1 : slash) = '\0';
        const char *d = slash ? dir : ".";
        if (access(log, F_OK) == 0 ? access(log, W_OK) != 0 : access(d, W_OK | X_OK) != 0)
            kvr_errlist_add(errs, "--access-log %s cannot be written: %s", log, strerror(errno));
    }
    return errs->n > before ? -1 : 0;
}

int main(int argc, char **argv)
{
    kvr_app *app = &g_app;
    char err[512];
    kvr_errlist errs = {0};
    kvr_config_default(&app->cfg);
    app->argc = argc;
    app->argv = argv;
    int rc = kvr_config_load(&app->cfg, argc, argv, &errs);
    if (rc == 1)
        return 0;
    if (rc < 0 && !app->cfg.check)
        kvr_errlist_print(&errs, stderr, "kvroute: ");
    if (app->cfg.check) {
        /* --check: every error on its own line (stdout), or a one-line summary. The files
         * read or written at start are tried too, so a config that --check passes starts. */
        if (rc == 0 && check_runtime_files(app, &errs) < 0)
            rc = -1;
        if (rc < 0) {
            kvr_errlist_print(&errs, stdout, NULL);
        } else {
            kvr_config_summary(&app->cfg, err, sizeof(err));
            printf("%s\n", err);
        }
        kvr_errlist_free(&errs);
        kvr_config_free(&app->cfg);
        return rc < 0 ? 1 : 0;
    }
    kvr_errlist_free(&errs);
    if (rc < 0)
        return 2;
    int lvl = kvr_log_parse_level(app->cfg.log_level);
    if (lvl < 0) {
        fprintf(stderr, "kvroute: --log-level: expected debug, info, warn or error\n");
        return 2;
    }
    kvr_log_set_level((kvr_log_level)lvl);
    if (app->cfg.seed)
        kvr_rand_seed(app->cfg.seed);
    kvr_session_sources_default(&app->session_sources);
    if (app->cfg.session_keys &&
        kvr_session_sources_parse(&app->session_sources, app->cfg.session_keys, err,
                                  sizeof(err)) < 0) {
        fprintf(stderr, "kvroute: --session-keys: %s\n", err);
        return 2;
    }
    if (kvr_admin_load_token(app, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvroute: %s\n", err);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Request bodies of many MiB come and go: a fixed mmap threshold makes every large buffer
     * its own mapping, returned to the OS when freed, so RSS follows the bodies actually held
     * (glibc's dynamic threshold would otherwise grow and keep them in the heap). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    /* ... while the heap keeps up to 8 MiB of free top instead of glibc's 128 KiB: with 8 KB
     * request bodies coming and going, trimming at 128 KiB gave back and faulted in the same
     * pages ~0.1 times a request (1.2 page faults per request, ~20 % of the hop's kernel
     * time; issue 18). */
    mallopt(M_TRIM_THRESHOLD, 8 * 1024 * 1024);
    /* Each client connection can hold a worker connection too: raise the soft fd limit to the
     * hard one, as nginx's worker_rlimit_nofile does, and say when the cap cannot be met. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur != RLIM_INFINITY && app->cfg.http.max_connections * 2 + 64 > rl.rlim_cur)
            KVR_WARN("msg=\"open-file limit below 2 x --max-connections\" nofile=%llu "
                     "max_connections=%zu",
                     (unsigned long long)rl.rlim_cur, app->cfg.http.max_connections);
    }

    app->loop = uv_default_loop();
    app->reg = kvr_registry_new();
    app->metrics = kvr_metrics_new();
    kvr_app_metrics_init(app);
    app->status = kvr_status_stats_new(app->cfg.status_ttft_samples, kvr_now_ms());
    app->text_cache = kvr_text_cache_new(app->cfg.routing_text_cache_bytes,
                                         KVR_TEXT_MEMO_MIN); /* NULL: texts built without */
    if (app->cfg.access_log) {
        app->access = kvr_access_log_open(app->loop, app->cfg.access_log,
                                          app->cfg.access_log_buffer_bytes, err, sizeof(err));
        if (!app->access) {
            fprintf(stderr, "kvroute: %s\n", err);
            return 1;
        }
    }
    app->cfg.upstream.allow_connect = kvr_app_allow_connect;
    app->cfg.upstream.allow_connect_ud = app;
    app->up = kvr_upstream_new(app->loop, &app->cfg.upstream);
    app->tokenizer = kvr_tokenizer_new(app->up, &app->cfg.tokenize);
    app->otlp = kvr_otlp_new(app->loop, app->up, app->metrics, &app->cfg.otlp);
    char kverr[256];
    app->kv = kvr_kv_events_new(app->loop, &app->cfg.kv, app->metrics, kvr_app_allow_connect,
                                app, kverr, sizeof(kverr));
    if (!app->kv) {
        fprintf(stderr, "kvroute: KV events: %s\n", kverr);
        return 1;
    }
    app->discovering = app->cfg.nroutes == 0 && !app->cfg.model;
    kvr_app_workers_ctx_init(app);
    app->wctx.on_down = kvr_proxy_engine_down;
    app->admission = kvr_admission_new(app->cfg.max_queue);
    if (kvr_app_apply(app, &app->cfg, &errs) < 0) {
        kvr_errlist_print(&errs, stderr, "kvroute: ");
        return 2;
    }
    if (kvr_app_cluster_start(app, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvroute: %s\n", err);
        return 2;
    }
    app->http = kvr_http_server_new(app->loop, &app->cfg.http, kvr_api_handle, app);
    int lr = kvr_http_server_listen(app->http, app->cfg.host, app->cfg.port);
    if (lr < 0) {
        fprintf(stderr, "kvroute: cannot listen on %s:%d: %s\n", app->cfg.host, app->cfg.port,
                uv_strerror(lr));
        return 1;
    }
    if (app->cfg.admin_port) {
        g_admin = kvr_http_server_new(app->loop, &app->cfg.http, kvr_admin_handle, app);
        lr = kvr_http_server_listen(g_admin, app->cfg.admin_host, app->cfg.admin_port);
        if (lr < 0) {
            fprintf(stderr, "kvroute: cannot listen on %s:%d (admin): %s\n",
                    app->cfg.admin_host, app->cfg.admin_port, uv_strerror(lr));
            return 1;
        }
    }
    uv_timer_init(app->loop, &g_sweep_timer);
    uv_timer_start(&g_sweep_timer, sweep_tick, 1000, 1000);
    /* An open breaker turns half-open within 50 ms of its cooldown. */
    uv_timer_init(app->loop, &g_breaker_timer);
    uv_timer_start(&g_breaker_timer, breaker_tick, 50, 50);
    kvr_scrape_start(&app->wctx);
    kvr_lmcache_start(&app->wctx);
    kvr_discovery_start(&app->wctx);
    if (kvr_app_k8s_start(app, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvroute: Kubernetes discovery: %s\n", err);
        return 2;
    }
    uv_signal_init(app->loop, &g_sigterm);
    uv_signal_init(app->loop, &g_sigint);
    uv_signal_init(app->loop, &g_sighup);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    uv_signal_start(&g_sighup, on_sighup, SIGHUP);
    uv_signal_init(app->loop, &g_sigusr1);
    uv_signal_start(&g_sigusr1, on_sigusr1, SIGUSR1);
    uv_timer_init(app->loop, &g_drain_timer);
    uv_timer_init(app->loop, &g_delay_timer);
    kvr_health_start(&app->wctx);
    KVR_INFO("msg=\"listening\" addr=%s:%d default_policy=%s workers=%zu routes=%zu mode=%s "
             "admin=%d",
             app->cfg.host, app->cfg.port, app->cfg.route.policy, app->cfg.nworkers,
             app->routes->n,
             app->cfg.nroutes ? "config" : app->cfg.model ? app->cfg.model : "(discovering)",
             app->cfg.admin_port);
    uv_run(app->loop, UV_RUN_DEFAULT);
    uv_loop_close(app->loop);
    kvr_route_table_free(app->routes);
    for (size_t i = 0; i < app->napi_workers; i++)
        kvr_api_worker_free(&app->api_workers[i]);
    free(app->api_workers);
    for (size_t i = 0; i < app->ndeparted; i++)
        kvr_worker_unref(app->departed[i]);
    free(app->departed);
    free(app->cluster_keys);
    kvr_auth_free(app->auth);
    for (size_t i = 0; i < app->nauth_retired; i++)
        kvr_auth_free(app->auth_retired[i]);
    free(app->auth_retired);
    kvr_egress_free(app->egress);
    kvr_ratelimits_free(app->ratelimits);
    kvr_admission_free(app->admission);
    kvr_metrics_free(app->metrics);
    kvr_status_stats_free(app->status);
    kvr_text_cache_free(app->text_cache);
    kvr_registry_free(app->reg);
    if (app->live && app->live != &app->cfg) {
        kvr_config_free(app->live);
        free(app->live);
    }
    kvr_config_free(&app->cfg);
    KVR_INFO("msg=\"exit\"");
    return 0;
}
