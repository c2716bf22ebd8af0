/* Kubernetes EndpointSlice list + watch per service (k8s.h), on the loop. */
#include "workers/k8s.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "upstream/upstream.h"
#include "util/buf.h"
#include "util/log.h"
#include "workers/k8s_parse.h"
#include "workers/k8s_sync.h"

#define BACKOFF_MIN_MS 500
#define TOKEN_MAX 16384
#define ERR_BODY_CAP 4096

typedef enum { PH_IDLE, PH_LIST, PH_WATCH } phase;

typedef struct watcher {
    struct kvr_k8s *k;
    const char *service;
    kvr_k8s_sync sync;  /* its slices and the workers told */
    char rv[KVR_K8S_RV_MAX + 1];
    kvr_upstream_attempt *att;
    phase ph;
    int status;
    int failed_in_body; /* an error found while reading: already handled */
    uint64_t started_ms; /* when the request started (uv_now) */
    uint64_t lines;      /* watch event lines read in this request */
    kvr_buf body;       /* list body, or a watch's partial line, or an error body */
    uv_timer_t timer;
    phase next;         /* what the timer starts */
    uint64_t backoff_ms;
    char err_state[400]; /* "" while fine; the last error logged */
} watcher;

struct kvr_k8s {
    uv_loop_t *loop;
    kvr_k8s_cfg cfg;
    kvr_k8s_hooks hooks;
    kvr_metric *errors;
    kvr_upstream *up;
    kvr_upstream_opts uo;
    char api[512];
    char ns[64];
    char token_path[4096];
    char ca_path[4096];
    watcher *w;
    size_t nw;
    size_t open_handles;
    int stopping;
    int token_optional; /* the default token path: absent means unauthenticated calls */
};

void kvr_k8s_cfg_default(kvr_k8s_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->watch_timeout_s = 300;
    c->data_parallel_size = 1;
    c->backoff_max_ms = 30000;
    c->max_event_bytes = 4u << 20;
    c->max_list_bytes = 32u << 20;
    c->max_endpoints = 1000;
}

int kvr_k8s_port_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0)
        return 0;
    int digits = 1, letter = 0;
    for (size_t i = 0; i < n; i++) {
        digits &= s[i] >= '0' && s[i] <= '9';
        letter |= s[i] >= 'a' && s[i] <= 'z';
    }
    if (digits) {
        if (n > 5)
            return 0;
        long v = strtol(s, NULL, 10);
        return v >= 1 && v <= 65535;
    }
    /* IANA_SVC_NAME, as Kubernetes validates port names: 1-15 of a-z, 0-9 and '-', at least
     * one letter, no '-' at either end, no "--". */
    if (n > 15 || !letter || s[0] == '-' || s[n - 1] == '-' || strstr(s, "--"))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

int kvr_k8s_dns_label(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

/* The first `cap - 1` bytes of a small file, surrounding whitespace trimmed. 0, or -1. */
static int read_trimmed(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    int bad = ferror(f) || (n == cap - 1 && fgetc(f) != EOF);
    fclose(f);
    out[n] = '\0';
    if (bad)
        return -1;
    char *s = out, *e = out + n;
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    memmove(out, s, (size_t)(e - s) + 1);
    return 0;
}

/* A token is sent in a header: visible ASCII only. */
static int token_ok(const char *t)
{
    if (!*t)
        return 0;
    for (; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f)
            return 0;
    return 1;
}

size_t kvr_k8s_worker_count(const kvr_k8s *k)
{
    size_t n = 0;
    for (size_t i = 0; k && i < k->nw; i++)
        n += kvr_k8s_sync_added(&k->w[i].sync);
    return n;
}

/* ---- errors and scheduling ---- */

static void start_phase(watcher *w, phase ph);

static void on_timer(uv_timer_t *t)
{
    watcher *w = t->data;
    start_phase(w, w->next);
}

static void schedule(watcher *w, phase ph, uint64_t ms)
{
    w->next = ph;
    uv_timer_start(&w->timer, on_timer, ms, 0);
}

/* Back to normal after errors: said once. */
static void recovered(watcher *w)
{
    w->backoff_ms = 0;
    if (w->err_state[0]) {
        KVR_INFO("msg=\"kubernetes discovery recovered\" service=%s", w->service);
        w->err_state[0] = '\0';
    }
}

/* A failure: counted; logged when it differs from the last one; retried after a backoff
 * (a watch resumes from its resourceVersion when it has one, else a relist). The workers
 * known stay. */
static void fail(watcher *w, const char *what)
{
    const char *lv[] = {"kubernetes"};
    kvr_metric_inc(w->k->errors, lv, 1);
    if (strcmp(w->err_state, what) != 0) {
        KVR_WARN("msg=\"kubernetes discovery failed; known workers kept, retrying\" "
                 "service=%s namespace=%s error=\"%s\"",
                 w->service, w->k->ns, what);
        snprintf(w->err_state, sizeof(w->err_state), "%s", what);
    }
    w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (w->backoff_ms > w->k->cfg.backoff_max_ms)
        w->backoff_ms = w->k->cfg.backoff_max_ms ? w->k->cfg.backoff_max_ms : BACKOFF_MIN_MS;
    schedule(w, w->rv[0] ? PH_WATCH : PH_LIST, w->backoff_ms);
}

static void relist(watcher *w, const char *why)
{
    KVR_INFO("msg=\"kubernetes watch expired; relisting\" service=%s reason=%s", w->service, why);
    w->rv[0] = '\0';
    schedule(w, PH_LIST, 0);
}

/* Ends the request in flight (from inside its callbacks too). */
static void abort_request(watcher *w)
{
    if (w->att) {
        kvr_upstream_cancel(w->att);
        w->att = NULL;
    }
    w->ph = PH_IDLE;
    kvr_buf_free(&w->body);
}

/* A resourceVersion goes into a query string: only what etcd revisions look like. */
static void set_rv(watcher *w, const char *rv)
{
    if (!*rv)
        return;
    for (const char *p = rv; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
            return;
    snprintf(w->rv, sizeof(w->rv), "%s", rv);
}

/* ---- requests ---- */

static const kvr_upstream_cbs cbs;

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    (void)h;
    (void)n;
    watcher *w = ud;
    w->status = status;
    if (w->ph == PH_WATCH && status == 200)
        recovered(w);
    if (status != 200)
        kvr_buf_init(&w->body, ERR_BODY_CAP);
}

/* One watch event line. Returns 0 to go on, -1 when the watch was ended here. */
static int watch_line(watcher *w, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (!len)
        return 0;
    kvr_k8s_sel sel = {w->k->cfg.port, w->k->cfg.max_endpoints, w->k->cfg.kv_port,
                       w->k->cfg.kv_replay_port};
    kvr_k8s_event ev;
    char err[128];
    if (kvr_k8s_parse_event(line, len, &sel, &ev, err, sizeof(err)) < 0) {
        abort_request(w);
        fail(w, "malformed watch event");
        w->rv[0] = '\0'; /* a change may be lost: relist */
        schedule(w, PH_LIST, w->backoff_ms);
        return -1;
    }
    switch (ev.type) {
    case KVR_K8S_ERROR:
        abort_request(w);
        if (ev.code == 410) {
            relist(w, ev.reason[0] ? ev.reason : "410");
        } else {
            char what[64];
            snprintf(what, sizeof(what), "watch ERROR event, code %d", ev.code);
            fail(w, what);
        }
        return -1;
    case KVR_K8S_BOOKMARK:
        set_rv(w, ev.rv);
        return 0;
    case KVR_K8S_ADDED:
    case KVR_K8S_MODIFIED:
    case KVR_K8S_DELETED:
        set_rv(w, ev.rv);
        kvr_k8s_sync_event(&w->sync, &ev.slice, ev.type == KVR_K8S_DELETED);
        kvr_k8s_sync_apply(&w->sync, &w->k->hooks);
        return 0;
    }
    return 0;
}

static int on_body(void *ud, const char *data, size_t len)
{
    watcher *w = ud;
    if (w->status != 200 || w->ph == PH_LIST) {
        if (kvr_buf_append(&w->body, data, len) < 0 && w->status == 200) {
            abort_request(w);
            fail(w, "EndpointSlice list over --k8s-max-list-bytes");
            w->failed_in_body = 1;
        }
        return 0;
    }
    /* Watch: complete lines are events. */
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl ? (size_t)(nl - data) : len;
        if (kvr_buf_append(&w->body, data, take) < 0) {
            abort_request(w);
            fail(w, "watch event over --k8s-max-event-bytes");
            w->rv[0] = '\0';
            return 0;
        }
        if (!nl)
            break;
        w->lines++;
        int rc = watch_line(w, w->body.data ? w->body.data : "", w->body.len);
        if (rc < 0)
            return 0; /* the attempt is gone */
        kvr_buf_reset(&w->body);
        data += take + 1;
        len -= take + 1;
    }
    return 0;
}

static void list_done(watcher *w)
{
    kvr_k8s_sel sel = {w->k->cfg.port, w->k->cfg.max_endpoints, w->k->cfg.kv_port,
                       w->k->cfg.kv_replay_port};
    kvr_k8s_slice *ss;
    char rv[KVR_K8S_RV_MAX + 1], err[128];
    int n = kvr_k8s_parse_list(w->body.data ? w->body.data : "", w->body.len, &sel, &ss, rv, err,
                               sizeof(err));
    kvr_buf_free(&w->body);
    if (n < 0) {
        fail(w, "malformed EndpointSlice list");
        return;
    }
    recovered(w);
    kvr_k8s_sync_replace(&w->sync, ss, (size_t)n);
    w->rv[0] = '\0';
    set_rv(w, rv);
    kvr_k8s_sync_apply(&w->sync, &w->k->hooks);
    schedule(w, w->rv[0] ? PH_WATCH : PH_LIST, w->rv[0] ? 0 : 1000);
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    watcher *w = ud;
    phase ph = w->ph;
    w->att = NULL;
    w->ph = PH_IDLE;
    if (w->failed_in_body) {
        kvr_buf_free(&w->body);
        return;
    }
    if (!got_headers || (err != KVR_UP_OK && w->status == 200 && ph == PH_LIST)) {
        kvr_buf_free(&w->body);
        char what[360];
        snprintf(what, sizeof(what), "%s: %.300s", kvr_upstream_err_name(err), msg ? msg : "");
        fail(w, what);
        return;
    }
    if (w->status == 410) {
        kvr_buf_free(&w->body);
        relist(w, "410 Gone");
        return;
    }
    if (w->status != 200) {
        kvr_buf_free(&w->body);
        char what[64];
        snprintf(what, sizeof(what), "API server answered %d", w->status);
        fail(w, what);
        return;
    }
    if (ph == PH_LIST) {
        list_done(w);
        return;
    }
    /* The server ended the watch (timeoutSeconds, or it went away after the head): resume
     * from the last resourceVersion; a stream cut mid-way is the same, as nothing after the
     * last complete event was applied. */
    kvr_buf_free(&w->body);
    if (err != KVR_UP_OK && err != KVR_UP_RESET) {
        char what[96];
        snprintf(what, sizeof(what), "watch: %s", kvr_upstream_err_name(err));
        fail(w, what);
        return;
    }
    /* A server that accepts watches and ends them at once, again and again, is not hammered:
     * an empty watch shorter than a second waits the backoff (not counted as an error). */
    uint64_t delay = 0;
    if (!w->lines && uv_now(w->k->loop) - w->started_ms < 1000) {
        w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : BACKOFF_MIN_MS;
        if (w->backoff_ms > w->k->cfg.backoff_max_ms)
            w->backoff_ms = w->k->cfg.backoff_max_ms;
        delay = w->backoff_ms;
    }
    schedule(w, w->rv[0] ? PH_WATCH : PH_LIST, delay);
}

static const kvr_upstream_cbs cbs = {on_headers, on_body, on_done};

static void start_phase(watcher *w, phase ph)
{
    kvr_k8s *k = w->k;
    if (k->stopping || w->att)
        return;
    if (ph == PH_WATCH && !w->rv[0])
        ph = PH_LIST;
    char token[TOKEN_MAX];
    int have_token = read_trimmed(k->token_path, token, sizeof(token)) == 0 && token_ok(token);
    if (!have_token && !k->token_optional) {
        memset(token, 0, sizeof(token));
        fail(w, "cannot read the token file");
        return;
    }
    char url[1024];
    int n = snprintf(url, sizeof(url),
                     "%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector="
                     "kubernetes.io%%2Fservice-name%%3D%s",
                     k->api, k->ns, w->service);
    if (ph == PH_WATCH)
        n += snprintf(url + n, sizeof(url) - (size_t)n,
                      "&watch=true&allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=%llu",
                      w->rv, (unsigned long long)k->cfg.watch_timeout_s);
    char auth[TOKEN_MAX + 16];
    int an = snprintf(auth, sizeof(auth), "Bearer %s", token);
    memset(token, 0, sizeof(token));
    kvr_http_header h[2] = {{"Authorization", 13, auth, (size_t)an},
                            {"Accept", 6, "application/json", 16}};
    w->status = 0;
    w->failed_in_body = 0;
    w->lines = 0;
    w->started_ms = uv_now(k->loop);
    kvr_buf_free(&w->body);
    kvr_buf_init(&w->body, ph == PH_LIST ? k->cfg.max_list_bytes : k->cfg.max_event_bytes);
    w->ph = ph;
    /* libcurl copies the request headers at start: `auth` may go with this frame. */
    w->att = have_token ? kvr_upstream_start(k->up, "GET", url, h, 2, NULL, 0, &cbs, w)
                        : kvr_upstream_start(k->up, "GET", url, h + 1, 1, NULL, 0, &cbs, w);
    memset(auth, 0, sizeof(auth));
    if (!w->att) {
        w->ph = PH_IDLE;
        fail(w, "cannot start a request to the API server");
    }
}

/* ---- start / stop ---- */

static int resolve(kvr_k8s *k, const kvr_k8s_cfg *cfg, char *err, size_t cap)
{
    if (cfg->api_url) {
        snprintf(k->api, sizeof(k->api), "%s", cfg->api_url);
    } else {
        const char *host = getenv("KUBERNETES_SERVICE_HOST");
        const char *port = getenv("KUBERNETES_SERVICE_PORT");
        if (!host || !*host) {
            snprintf(err, cap, "no --k8s-api-url and KUBERNETES_SERVICE_HOST is not set (not "
                               "in a pod?)");
            return -1;
        }
        snprintf(k->api, sizeof(k->api), strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s",
                 host, port && *port ? port : "443");
    }
    size_t al = strlen(k->api);
    while (al && k->api[al - 1] == '/')
        k->api[--al] = '\0';
    if ((strncmp(k->api, "https://", 8) != 0 && strncmp(k->api, "http://", 7) != 0) ||
        strpbrk(k->api, " \t\r\n?#")) {
        snprintf(err, cap, "--k8s-api-url %s: expected https://HOST[:PORT]", k->api);
        return -1;
    }
    snprintf(k->token_path, sizeof(k->token_path), "%s",
             cfg->token_file ? cfg->token_file : KVR_K8S_SA_DIR "/token");
    if (cfg->ca_file)
        snprintf(k->ca_path, sizeof(k->ca_path), "%s", cfg->ca_file);
    else if (access(KVR_K8S_SA_DIR "/ca.crt", R_OK) == 0)
        snprintf(k->ca_path, sizeof(k->ca_path), "%s", KVR_K8S_SA_DIR "/ca.crt");
    if (cfg->ca_file && access(cfg->ca_file, R_OK) != 0) {
        snprintf(err, cap, "--k8s-ca-file %s cannot be read", cfg->ca_file);
        return -1;
    }
    if (cfg->ns) {
        snprintf(k->ns, sizeof(k->ns), "%s", cfg->ns);
    } else if (read_trimmed(KVR_K8S_SA_DIR "/namespace", k->ns, sizeof(k->ns)) < 0) {
        /* Out of a pod without --k8s-namespace: kubectl's default. */
        snprintf(k->ns, sizeof(k->ns), "default");
        KVR_WARN("msg=\"no --k8s-namespace and no service-account namespace: using default\"");
    }
    if (!kvr_k8s_dns_label(k->ns)) {
        snprintf(err, cap, "namespace '%.64s' is not a DNS label", k->ns);
        return -1;
    }
    char token[TOKEN_MAX];
    int tr = read_trimmed(k->token_path, token, sizeof(token));
    int tok = tr == 0 && token_ok(token);
    memset(token, 0, sizeof(token));
    if (!tok && cfg->token_file) {
        snprintf(err, cap, "--k8s-token-file %s cannot be read (or is empty)", k->token_path);
        return -1;
    }
    /* No service-account token mounted (automountServiceAccountToken: false, or out of a
     * pod): requests go without one, and use it as soon as it appears. */
    k->token_optional = !cfg->token_file;
    if (!tok)
        KVR_WARN("msg=\"no service-account token: Kubernetes API calls go unauthenticated\" "
                 "path=%s", k->token_path);
    for (size_t i = 0; i < cfg->nservices; i++)
        if (!kvr_k8s_dns_label(cfg->services[i])) {
            snprintf(err, cap, "--k8s-service '%.64s' is not a DNS label", cfg->services[i]);
            return -1;
        }
    return 0;
}

kvr_k8s *kvr_k8s_start(uv_loop_t *loop, const kvr_k8s_cfg *cfg, const kvr_k8s_hooks *hooks,
                       kvr_metric *errors, char *err, size_t cap)
{
    kvr_k8s *k = calloc(1, sizeof(*k));
    if (!k) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    k->loop = loop;
    k->cfg = *cfg;
    k->hooks = *hooks;
    k->errors = errors;
    if (resolve(k, cfg, err, cap) < 0 ||
        !(k->w = calloc(cfg->nservices ? cfg->nservices : 1, sizeof(*k->w)))) {
        free(k);
        return NULL;
    }
    kvr_upstream_opts_default(&k->uo);
    k->uo.client = KVR_UP_CLIENT_CURL;
    k->uo.first_byte_timeout_ms = 15000;
    k->uo.stream_idle_timeout_ms = (k->cfg.watch_timeout_s + 30) * 1000;
    k->uo.ca_file = k->ca_path[0] ? k->ca_path : NULL;
    k->uo.allow_connect = hooks->allow_connect;
    k->uo.allow_connect_ud = hooks->ud;
    k->up = kvr_upstream_new(loop, &k->uo);
    k->nw = cfg->nservices;
    for (size_t i = 0; i < k->nw; i++) {
        watcher *w = &k->w[i];
        w->k = k;
        w->service = cfg->services[i];
        w->sync.service = w->service;
        uv_timer_init(loop, &w->timer);
        w->timer.data = w;
        k->open_handles++;
        KVR_INFO("msg=\"kubernetes discovery\" service=%s namespace=%s api=%s port=%s",
                 w->service, k->ns, k->api, cfg->port ? cfg->port : "-");
        schedule(w, PH_LIST, 0);
    }
    return k;
}

static void on_timer_closed(uv_handle_t *h)
{
    watcher *w = h->data;
    kvr_k8s *k = w->k;
    if (--k->open_handles)
        return;
    for (size_t i = 0; i < k->nw; i++) {
        kvr_k8s_sync_free(&k->w[i].sync);
        kvr_buf_free(&k->w[i].body);
    }
    free(k->w);
    free(k);
}

void kvr_k8s_stop(kvr_k8s *k)
{
    if (!k || k->stopping)
        return;
    k->stopping = 1;
    for (size_t i = 0; i < k->nw; i++)
        abort_request(&k->w[i]);
    kvr_upstream_close(k->up);
    k->up = NULL;
    if (!k->nw) {
        free(k->w);
        free(k);
        return;
    }
    for (size_t i = 0; i < k->nw; i++) {
        uv_timer_stop(&k->w[i].timer);
        uv_close((uv_handle_t *)&k->w[i].timer, on_timer_closed);
    }
}
