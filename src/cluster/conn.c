/* The cluster's Redis connections: connect, authenticate, watch for stalls, reconnect with
 * backoff; lifecycle, metrics and GET /cluster (cluster/cluster.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wcast-function-type"
#include <hiredis/adapters/libuv.h>
#pragma GCC diagnostic pop

#include "cluster/internal.h"
#include "util/log.h"
#include "util/time.h"

/* Reconnect backoff: from this, doubling, up to the cap (the issue: capped at 1 s, so
 * kvroute_redis_up is back to 1 within 2 s of Redis answering again). */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
/* How often stalls and the warm deadline are checked. */
#define WATCHDOG_MS 50

void kvr_cluster_cfg_default(kvr_cluster_cfg *c)
{
    *c = (kvr_cluster_cfg){
        .key_prefix = "kvroute:",
        .log_max_len = 1000000,
        .flush_ms = 2,
        .warm_max_entries = 1000000,
        .warm_timeout_ms = 10000,
        .warm_hold_ms = 1000,
        .load_interval_ms = 200,
        .timeout_ms = 5,
        .stall_ms = 1000,
        .queue_max = 100000,
        .queue_max_bytes = 64u << 20,
        .entry_max_blocks = 8192,
        .read_count = 512,
    };
}

uint64_t kvr_cluster_wall_ms(void)
{
    return kvr_unix_ns() / 1000000u;
}

void kvr_cluster_error(kvr_cluster *c, const char *op)
{
    const char *lv[] = {op};
    kvr_metric_inc(c->m_errors, lv, 1);
}

/* First line of `path` into out (cap bytes), without its newline. */
static int read_first_line(const char *path, char *out, size_t cap, char *err, size_t ecap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, ecap, "--redis-password-file %s: %s", path, strerror(errno));
        return -1;
    }
    if (!fgets(out, (int)cap, f))
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
    return 0;
}

int kvr_cluster_check(const kvr_cluster_cfg *cfg, char *err, size_t cap)
{
    kvr_redis_url u;
    char e[300];
    if (kvr_redis_url_parse(cfg->url, &u, e, sizeof(e)) < 0) {
        snprintf(err, cap, "--redis: %s", e);
        return -1;
    }
    if (!cfg->key_prefix || strlen(cfg->key_prefix) > 200) {
        snprintf(err, cap, "--redis-key-prefix: at most 200 bytes");
        return -1;
    }
    if (cfg->replica_id && (!*cfg->replica_id || strlen(cfg->replica_id) > KVR_ENTRY_MAX_NAME)) {
        snprintf(err, cap, "--replica-id: 1..%d bytes", KVR_ENTRY_MAX_NAME);
        return -1;
    }
    char pw[256];
    if (cfg->password_file && read_first_line(cfg->password_file, pw, sizeof(pw), err, cap) < 0)
        return -1;
    return 0;
}

static void set_up(kvr_cluster *c, int up)
{
    kvr_metric_set(c->m_up, NULL, up);
    /* Down is worth an operator's eye (the replicas stop sharing); up again is news. */
    if (up != c->was_up)
        kvr_log(up ? KVR_LOG_INFO : KVR_LOG_WARN, "msg=\"redis %s\" host=%s port=%d replica=%s",
                up ? "up" : "down", c->url.host, c->url.port, c->replica);
    c->was_up = up;
}

int kvr_cluster_up(const kvr_cluster *c)
{
    return c->cmd.ready && c->rd.ready;
}

int kvr_conn_send(kvr_conn *k, redisCallbackFn *fn, void *priv, int argc, const char **argv,
                  const size_t *lens)
{
    if (!k->ac)
        return -1;
    if (!k->pending)
        k->progress_ms = kvr_now_ms();
    if (redisAsyncCommandArgv(k->ac, fn, priv, argc, argv, lens) != REDIS_OK)
        return -1;
    k->pending++;
    return 0;
}

int kvr_conn_settle(kvr_conn *k, redisAsyncContext *ac)
{
    if (!k->ac || k->ac != ac)
        return 0;
    if (k->pending)
        k->pending--;
    k->progress_ms = kvr_now_ms();
    return 1;
}

static void drop(kvr_conn *k)
{
    redisAsyncContext *ac = k->ac;
    k->ac = NULL;
    k->ready = 0;
    k->pending = 0;
    k->allowance_ms = 0;
    if (ac)
        redisAsyncFree(ac); /* pending callbacks run with no reply: stale, ignored */
}

static void schedule_reconnect(kvr_cluster *c)
{
    if (c->closing)
        return;
    uint64_t d = c->backoff_ms ? c->backoff_ms : BACKOFF_MIN_MS;
    c->backoff_ms = d * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d * 2;
    uv_timer_start(&c->reconnect_timer, kvr_cluster_reconnect_cb, d, 0);
}

void kvr_cluster_fail(kvr_cluster *c, const char *op)
{
    if (op)
        kvr_cluster_error(c, op);
    c->load_pending = 0; /* its reply, if any, is discarded with the connection */
    if (c->holding)
        kvr_hold_release(c); /* no request waits for a Redis that fails */
    drop(&c->cmd);
    drop(&c->rd);
    set_up(c, 0);
    /* Once per failure: the first of its callbacks schedules the next attempt. */
    if (!c->resolving && !uv_is_active((uv_handle_t *)&c->reconnect_timer))
        schedule_reconnect(c);
}

static void on_ready_reply(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_conn *k = priv;
    if (!kvr_conn_settle(k, ac) || !r)
        return;
    redisReply *rep = r;
    if (rep->type == REDIS_REPLY_ERROR) {
        KVR_WARN("msg=\"redis refused the connection's setup\" conn=%s error=\"%.200s\"",
                 k->name, rep->str);
        kvr_cluster_fail(k->c, "auth");
        return;
    }
    if (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "PONG") != 0)
        return; /* AUTH / SELECT's OK: the PING comes last */
    k->ready = 1;
    kvr_cluster *c = k->c;
    if (kvr_cluster_up(c)) {
        c->backoff_ms = 0;
        set_up(c, 1);
        kvr_log_on_up(c);
    }
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    kvr_conn *k = ac->data;
    if (k->ac != ac || status == REDIS_OK)
        return;
    k->ac = NULL; /* hiredis frees it after this callback */
    k->ready = 0;
    k->pending = 0;
    kvr_cluster_fail(k->c, "connect");
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    kvr_conn *k = ac->data;
    if (k->ac != ac)
        return;
    k->ac = NULL; /* freed by hiredis after this callback */
    k->ready = 0;
    k->pending = 0;
    kvr_cluster_fail(k->c, "disconnect");
}

static int open_conn(kvr_cluster *c, kvr_conn *k)
{
    redisAsyncContext *ac = redisAsyncConnect(c->addr, c->url.port);
    if (!ac)
        return -1;
    if (ac->err) {
        redisAsyncFree(ac);
        return -1;
    }
    ac->data = k;
    if (redisLibuvAttach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        return -1;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    k->ac = ac;
    k->ready = 0;
    k->pending = 0;
    k->allowance_ms = 0;
    k->progress_ms = kvr_now_ms();
    if (c->password[0]) {
        const char *argv[3] = {"AUTH", c->url.user, c->password};
        size_t lens[3] = {4, strlen(c->url.user), strlen(c->password)};
        int skip = c->url.user[0] ? 0 : 1;
        if (skip) {
            argv[1] = c->password;
            lens[1] = lens[2];
        }
        kvr_conn_send(k, on_ready_reply, k, 3 - skip, argv, lens);
    }
    if (c->url.db) {
        char db[16];
        int n = snprintf(db, sizeof(db), "%d", c->url.db);
        const char *argv[2] = {"SELECT", db};
        size_t lens[2] = {6, (size_t)n};
        kvr_conn_send(k, on_ready_reply, k, 2, argv, lens);
    }
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    return kvr_conn_send(k, on_ready_reply, k, 1, argv, lens);
}

/* A host name is looked up on libuv's thread pool (hiredis would call getaddrinfo on the
 * loop); the request outlives a cluster closed meanwhile (its back pointer is cleared). */
struct resolve {
    uv_getaddrinfo_t req;
    kvr_cluster *c;
};

static void connect_both(kvr_cluster *c)
{
    if (open_conn(c, &c->cmd) < 0 || open_conn(c, &c->rd) < 0)
        kvr_cluster_fail(c, "connect");
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct resolve *r = req->data;
    kvr_cluster *c = r->c;
    if (c) {
        c->resolving = NULL;
        if (status == 0 && res &&
            uv_ip_name(res->ai_addr, c->addr, sizeof(c->addr)) == 0) {
            connect_both(c);
        } else {
            KVR_WARN("msg=\"redis host lookup failed\" host=%s error=\"%s\"", c->url.host,
                     uv_strerror(status ? status : UV_EAI_NONAME));
            kvr_cluster_error(c, "connect");
            set_up(c, 0);
            if (!uv_is_active((uv_handle_t *)&c->reconnect_timer))
                schedule_reconnect(c);
        }
    }
    uv_freeaddrinfo(res);
    free(r);
}

void kvr_cluster_reconnect_cb(uv_timer_t *t)
{
    kvr_cluster *c = t->data;
    if (c->closing || c->resolving)
        return;
    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, c->url.host, buf) == 1 || inet_pton(AF_INET6, c->url.host, buf) == 1) {
        snprintf(c->addr, sizeof(c->addr), "%s", c->url.host);
        connect_both(c);
        return;
    }
    struct resolve *r = calloc(1, sizeof(*r));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    if (!r)
        return;
    r->c = c;
    r->req.data = r;
    if (uv_getaddrinfo(c->loop, &r->req, on_resolved, c->url.host, NULL, &hints) != 0) {
        free(r);
        kvr_cluster_error(c, "connect");
        schedule_reconnect(c);
        return;
    }
    c->resolving = r;
}

static void watchdog_cb(uv_timer_t *t)
{
    kvr_cluster *c = t->data;
    uint64_t now = kvr_now_ms();
    kvr_conn *ks[2] = {&c->cmd, &c->rd};
    for (int i = 0; i < 2; i++) {
        kvr_conn *k = ks[i];
        /* A refused connection shows as an error on the poll handle, which hiredis 0.14's
         * libuv adapter ignores: look at the socket's pending error while connecting. */
        if (k->ac && !(k->ac->c.flags & REDIS_CONNECTED) && k->ac->c.fd >= 0) {
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (getsockopt(k->ac->c.fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr) {
                KVR_DEBUG("msg=\"redis connect failed\" conn=%s error=\"%s\"", k->name,
                          strerror(soerr));
                kvr_cluster_fail(c, "connect");
                break;
            }
        }
        if (k->ac && (k->pending || !k->ready) &&
            now - k->progress_ms > c->cfg.stall_ms + k->allowance_ms) {
            KVR_WARN("msg=\"redis stalled: reconnecting\" conn=%s pending=%zu", k->name,
                     k->pending);
            kvr_cluster_fail(c, "stall");
            break;
        }
    }
    if (!c->warm && now - c->start_ms >= c->cfg.warm_timeout_ms)
        kvr_log_warm_deadline(c);
}

kvr_cluster *kvr_cluster_new(uv_loop_t *loop, const kvr_cluster_cfg *cfg, kvr_metrics *metrics,
                             const kvr_cluster_hooks *hooks, char *err, size_t cap)
{
    if (kvr_cluster_check(cfg, err, cap) < 0)
        return NULL;
    kvr_cluster *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    c->loop = loop;
    c->cfg = *cfg;
    c->hooks = *hooks;
    char e[300];
    kvr_redis_url_parse(cfg->url, &c->url, e, sizeof(e));
    snprintf(c->password, sizeof(c->password), "%s", c->url.password);
    if (cfg->password_file)
        read_first_line(cfg->password_file, c->password, sizeof(c->password), e, sizeof(e));
    uint64_t nonce;
    if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != (ssize_t)sizeof(nonce))
        nonce = kvr_now_ms() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    snprintf(c->inst, sizeof(c->inst), "%016llx", (unsigned long long)nonce);
    if (cfg->replica_id) {
        snprintf(c->replica, sizeof(c->replica), "%s", cfg->replica_id);
    } else {
        char host[200] = "kvroute";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        snprintf(c->replica, sizeof(c->replica), "%s-%ld", host, (long)getpid());
    }
    const char *p = cfg->key_prefix ? cfg->key_prefix : "";
    snprintf(c->key_log, sizeof(c->key_log), "%slog", p);
    snprintf(c->key_replicas, sizeof(c->key_replicas), "%sreplicas", p);
    snprintf(c->key_load, sizeof(c->key_load), "%sload:", p);
    snprintf(c->last_id, sizeof(c->last_id), "0-0");
    kvr_buf_init(&c->queue, 0);
    c->cmd = (kvr_conn){.c = c, .name = "cmd"};
    c->rd = (kvr_conn){.c = c, .name = "log"};
    c->start_ms = kvr_now_ms();
    c->start_wall_ms = kvr_cluster_wall_ms();
    c->warming = 1;
    c->holding = 1;

    c->m_up = kvr_metrics_gauge(metrics, "kvroute_redis_up",
                                "1 while this replica's Redis connections are up", 0, NULL);
    const char *dir[] = {"direction"};
    c->m_entries = kvr_metrics_counter(metrics, "kvroute_redis_log_entries_total",
                                       "Routing-log entries written (out) and applied (in)", 1,
                                       dir);
    c->m_lag = kvr_metrics_gauge(metrics, "kvroute_redis_log_lag_seconds",
                                 "Age of the newest routing-log entry applied, when applied", 0,
                                 NULL);
    const char *op[] = {"op"};
    c->m_errors = kvr_metrics_counter(metrics, "kvroute_redis_errors_total",
                                      "Redis failures by operation", 1, op);
    c->m_replicas = kvr_metrics_gauge(metrics, "kvroute_cluster_replicas",
                                      "Replicas with fresh load entries (this one included)", 0,
                                      NULL);
    c->m_conflict = kvr_metrics_gauge(
        metrics, "kvroute_cluster_replica_id_conflict",
        "1 while another live process publishes under this --replica-id", 0, NULL);
    kvr_metric_set(c->m_conflict, NULL, 0);
    const char *out[] = {"out"}, *in[] = {"in"};
    kvr_metric_inc(c->m_entries, out, 0);
    kvr_metric_inc(c->m_entries, in, 0);

    uv_timer_t *timers[4] = {&c->reconnect_timer, &c->watchdog_timer, &c->flush_timer,
                             &c->load_timer};
    for (int i = 0; i < 4; i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = c;
    }
    uv_timer_start(&c->watchdog_timer, watchdog_cb, WATCHDOG_MS, WATCHDOG_MS);
    uv_timer_start(&c->load_timer, kvr_load_tick, c->cfg.load_interval_ms,
                   c->cfg.load_interval_ms);
    KVR_INFO("msg=\"cluster\" redis=%s:%d db=%d prefix=\"%s\" replica=%s", c->url.host,
             c->url.port, c->url.db, p, c->replica);
    kvr_cluster_reconnect_cb(&c->reconnect_timer);
    return c;
}

static void on_timer_closed(uv_handle_t *h)
{
    kvr_cluster *c = h->data;
    if (--c->closing == 1) {
        kvr_log_free(c);
        kvr_load_free(c);
        free(c);
    }
}

void kvr_cluster_close(kvr_cluster *c)
{
    if (!c || c->closing)
        return;
    c->closing = 5; /* 1 + the four timers still to close */
    if (c->resolving) {
        c->resolving->c = NULL; /* its callback frees it alone */
        uv_cancel((uv_req_t *)&c->resolving->req);
        c->resolving = NULL;
    }
    drop(&c->cmd);
    drop(&c->rd);
    uv_timer_t *timers[4] = {&c->reconnect_timer, &c->watchdog_timer, &c->flush_timer,
                             &c->load_timer};
    for (int i = 0; i < 4; i++) {
        uv_timer_stop(timers[i]);
        uv_close((uv_handle_t *)timers[i], on_timer_closed);
    }
}

const char *kvr_cluster_replica_id(const kvr_cluster *c)
{
    return c->replica;
}

int kvr_cluster_warm(const kvr_cluster *c)
{
    return c->warm;
}

size_t kvr_cluster_replicas(const kvr_cluster *c)
{
    return c->replicas;
}

json_t *kvr_cluster_json(const kvr_cluster *c)
{
    /* Ages are as of now: while Redis cannot be reached they grow instead of freezing at the
     * last poll (this replica's own: since its last load exchange went through). */
    uint64_t now = kvr_now_ms(), since = c->load_ok_ms && now > c->load_ok_ms
                                             ? now - c->load_ok_ms : 0;
    json_t *reps = json_array();
    json_array_append_new(reps, json_pack("{s:s,s:o,s:s,s:b}", "id", c->replica, "load_age_ms",
                                          c->load_ok_ms ? json_integer((json_int_t)since)
                                                        : json_null(),
                                          "log_position", c->last_id, "self", 1));
    for (size_t i = 0; i < c->nseen; i++)
        json_array_append_new(reps, json_pack("{s:s,s:I,s:s,s:b}", "id", c->seen[i].id,
                                              "load_age_ms",
                                              (json_int_t)(c->seen[i].age_ms + since),
                                              "log_position", c->seen[i].pos, "self", 0));
    char where[300]; /* never the URL itself: it may hold a password */
    snprintf(where, sizeof(where), "%s:%d/%d", c->url.host, c->url.port, c->url.db);
    return json_pack("{s:s,s:b,s:s,s:s,s:b,s:b,s:{s:s,s:I,s:I,s:f,s:I},s:I,s:o}",
                     "replica_id", c->replica, "replica_id_conflict", c->id_conflict, "redis",
                     where, "key_prefix",
                     c->cfg.key_prefix ? c->cfg.key_prefix : "", "redis_up", kvr_cluster_up(c),
                     "warm", c->warm, "log", "last_id", c->last_id, "out",
                     (json_int_t)c->out_total, "in", (json_int_t)c->in_total, "lag_seconds",
                     c->lag_s, "queued", (json_int_t)c->queued, "live_replicas",
                     (json_int_t)(c->replicas ? c->replicas : 1), "replicas", reps);
}
