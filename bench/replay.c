/* One thread, one libcurl multi handle: a timer heap says which session turns are due, due
 * turns become easy handles, curl_multi_poll sleeps until a socket or the next due time. */
#include "replay.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "sse.h"
#include "util/buf.h"
#include "util/time.h"

void kvr_bench_config_defaults(kvr_bench_config *c)
{
    memset(c, 0, sizeof(*c));
    c->mode = KVR_BENCH_MODE_CONCURRENCY;
    c->concurrency = 8;
    c->rate = 1.0;
    c->time_scale = 1.0;
    c->think_ms = 1000;
    c->slo_ttft_ms = 2000;
    c->slo_itl_ms = 100;
    c->session_header_share = 0.5;
    c->seed = 1;
    c->max_tokens_cap = 512;
    c->default_max_tokens = 256;
    c->max_inflight = 1024;
    c->timeout_ms = 600000;
    c->connect_timeout_ms = 10000;
    c->max_event_bytes = 1 << 20;
}

/* ---- deterministic per-session randomness */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t seed, uint64_t a, uint64_t b)
{
    return (double)(mix(mix(mix(seed) ^ a) ^ b) >> 11) * 0x1.0p-53;
}

typedef struct {
    uint64_t h;
    size_t i;
} hidx;

static int cmp_hidx(const void *a, const void *b)
{
    const hidx *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h ? 1 : (x->i > y->i) - (x->i < y->i);
}

int kvr_bench_pick_header_sessions(size_t n, double share, uint64_t seed, bool *out)
{
    if (share < 0)
        share = 0;
    if (share > 1)
        share = 1;
    size_t k = (size_t)llround(share * (double)n);
    hidx *v = malloc((n ? n : 1) * sizeof(*v));
    if (!v)
        return -1;
    for (size_t i = 0; i < n; i++) {
        v[i].h = mix(mix(seed ^ 0x5e5510) ^ i);
        v[i].i = i;
        out[i] = false;
    }
    qsort(v, n, sizeof(*v), cmp_hidx);
    for (size_t j = 0; j < k; j++)
        out[v[j].i] = true;
    free(v);
    return 0;
}

int kvr_bench_bypass_pick(uint64_t seed, size_t session, size_t turn, double share, size_t nworkers)
{
    if (!(share > 0) || nworkers == 0)
        return -1;
    if (share < 1 && unit(seed ^ 0xb7a55, session, turn) >= share)
        return -1;
    size_t i = (size_t)(unit(seed ^ 0xb7a56, session, turn) * (double)nworkers);
    return (int)(i < nworkers ? i : nworkers - 1);
}

uint64_t kvr_bench_variant(uint32_t pass, uint32_t copy)
{
    return ((uint64_t)pass << 32) | copy;
}

size_t kvr_bench_spread_pick(uint64_t seed, size_t session, size_t turn, size_t nurls)
{
    size_t i = (size_t)(unit(seed ^ 0x5b7ead, session, turn) * (double)nurls);
    return i < nurls ? i : nurls - 1;
}

double kvr_bench_think_ms(uint64_t seed, size_t session, size_t turn, double mean_ms)
{
    if (mean_ms <= 0)
        return 0;
    double u = unit(seed ^ 0x7417c, session, turn);
    return -mean_ms * log1p(-u);
}

/* ---- stream digestion */

void kvr_bench_stream_init(kvr_bench_stream *s)
{
    memset(s, 0, sizeof(*s));
    s->prompt_tokens = -1;
    s->completion_tokens = -1;
}

/* True when `key` (quoted) occurs in data with a value other than null. */
static bool has_nonnull(const char *data, size_t len, const char *key)
{
    size_t klen = strlen(key);
    const char *p = data, *end = data + len;
    while ((p = memmem(p, (size_t)(end - p), key, klen)) != NULL) {
        const char *q = p + klen;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
            q++;
        if (q < end && *q == ':') {
            q++;
            while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
                q++;
            if (!(end - q >= 4 && memcmp(q, "null", 4) == 0))
                return true;
        }
        p += klen;
    }
    return false;
}

static bool nonempty_text(const json_t *v)
{
    return (json_is_string(v) && json_string_length(v) > 0) ||
           (json_is_array(v) && json_array_size(v) > 0);
}

bool kvr_bench_stream_event(kvr_bench_stream *s, const char *data, size_t len)
{
    while (len && (*data == ' ' || *data == '\t'))
        data++, len--;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->done = true;
        return false;
    }
    if (s->first_content && !has_nonnull(data, len, "\"usage\"") &&
        !has_nonnull(data, len, "\"error\""))
        return false;
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!json_is_object(j)) {
        s->bad_json = true;
        json_decref(j);
        return false;
    }
    bool first = false;
    json_t *e = json_object_get(j, "error");
    if (e && !json_is_null(e))
        s->error = true;
    size_t i;
    json_t *ch;
    json_array_foreach(json_object_get(j, "choices"), i, ch)
    {
        json_t *d = json_object_get(ch, "delta");
        if (nonempty_text(json_object_get(d, "content")) ||
            nonempty_text(json_object_get(d, "reasoning_content")) ||
            nonempty_text(json_object_get(d, "reasoning")) ||
            nonempty_text(json_object_get(d, "tool_calls")) ||
            nonempty_text(json_object_get(ch, "text"))) {
            if (!s->first_content)
                first = true;
            s->first_content = true;
        }
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        s->usage = true;
        json_t *pt = json_object_get(u, "prompt_tokens"), *ct = json_object_get(u, "completion_tokens");
        json_t *cached = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(pt))
            s->prompt_tokens = json_integer_value(pt);
        if (json_is_integer(ct))
            s->completion_tokens = json_integer_value(ct);
        s->cached_tokens = json_is_integer(cached) ? json_integer_value(cached) : 0;
    }
    json_decref(j);
    return first;
}

/* ---- timer heap of (due time, session) */

typedef struct {
    uint64_t due_ns;
    uint32_t session;
} due_t;

typedef struct {
    due_t *v;
    size_t n, cap;
} heap_t;

static int heap_push(heap_t *h, uint64_t due, uint32_t session)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 256;
        due_t *nv = realloc(h->v, nc * sizeof(*nv));
        if (!nv)
            return -1;
        h->v = nv;
        h->cap = nc;
    }
    size_t i = h->n++;
    h->v[i] = (due_t){due, session};
    while (i) {
        size_t p = (i - 1) / 2;
        /* Ties keep session order so equal arrival times start in trace order. */
        if (h->v[p].due_ns < h->v[i].due_ns ||
            (h->v[p].due_ns == h->v[i].due_ns && h->v[p].session <= h->v[i].session))
            break;
        due_t tmp = h->v[p];
        h->v[p] = h->v[i];
        h->v[i] = tmp;
        i = p;
    }
    return 0;
}

static bool less(const due_t *a, const due_t *b)
{
    return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->session < b->session);
}

static due_t heap_pop(heap_t *h)
{
    due_t top = h->v[0];
    h->v[0] = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && less(&h->v[l], &h->v[m]))
            m = l;
        if (r < h->n && less(&h->v[r], &h->v[m]))
            m = r;
        if (m == i)
            break;
        due_t tmp = h->v[m];
        h->v[m] = h->v[i];
        h->v[i] = tmp;
        i = m;
    }
    return top;
}

/* ---- one request in flight */

typedef struct req {
    struct req *prev, *next; /* list of requests in flight, for aborting them at the end */
    CURL *easy;
    struct curl_slist *headers;
    kvr_buf body;
    kvr_buf errbody; /* non-2xx body, kept for the first error message */
    kvr_sse sse;
    kvr_bench_stream stream;
    struct replay *rp;
    uint32_t session, turn; /* session: the virtual session (copy × n + trace session) */
    uint64_t t0_ns, first_ns;
    int status;
    bool headers_done;
    bool session_header;
    int bypass;  /* index into bypass_workers, -1 when sent to the router */
    size_t via;  /* index into the router URLs (--url) it was sent to */
    int worker;  /* tally index; -1 until headers end */
    char worker_name[512];
    char decision[128];
} req_t;

typedef struct replay {
    const kvr_bench_trace *t;
    const kvr_bench_config *c;
    kvr_bench_run *run;
    CURLM *multi;
    char endpoint[2048];
    char **endpoints;        /* per --url when several: <url>/v1/chat/completions (owned) */
    size_t nendpoints;
    size_t spread_next;      /* round robin position over endpoints */
    char **bypass_endpoints; /* per bypass worker: <url>/v1/chat/completions (owned) */
    heap_t heap;
    bool *header;          /* per trace session: sends x-session-id */
    uint32_t *next_turn;   /* per virtual session */
    size_t nsess;          /* virtual sessions: c->sessions, or the trace's */
    size_t next_session;   /* CONCURRENCY: first session not started yet */
    size_t active;         /* sessions started and not finished */
    size_t inflight;
    size_t sent;
    size_t sessions_done;
    kvr_bench_body_opts body_opts;
    req_t *live; /* requests added to the multi handle */
    uint64_t last_progress_ns;
    bool oom;
} replay_t;

static void run_gauge(replay_t *rp, int w, int64_t delta, uint64_t now)
{
    kvr_bench_run *r = rp->run;
    if (w < 0)
        return;
    while ((size_t)w >= r->inflight_cap) {
        size_t nc = r->inflight_cap ? r->inflight_cap * 2 : 8;
        kvr_bench_gauge *ng = realloc(r->inflight, nc * sizeof(*ng));
        if (!ng) {
            rp->oom = true;
            return;
        }
        memset(ng + r->inflight_cap, 0, (nc - r->inflight_cap) * sizeof(*ng));
        r->inflight = ng;
        r->inflight_cap = nc;
    }
    kvr_bench_gauge_add(&r->inflight[w], delta, now);
}

static size_t header_cb(char *buf, size_t size, size_t n, void *ud)
{
    req_t *q = ud;
    size_t len = size * n;
    if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
        /* A new status line (after a 1xx, or a redirect) starts the header set over. */
        int st = 0;
        const char *sp = memchr(buf, ' ', len);
        if (sp)
            st = atoi(sp + 1);
        q->status = st;
        q->worker_name[0] = q->decision[0] = '\0';
        return len;
    }
    if (len <= 2 && (buf[0] == '\r' || buf[0] == '\n')) {
        if (q->status >= 200 && !q->headers_done) {
            q->headers_done = true;
            /* Without the router's header the worker is the URL the request went to. */
            const char *name = q->worker_name[0] ? q->worker_name
                               : q->bypass >= 0  ? q->rp->c->bypass_workers[q->bypass]
                               : q->rp->nendpoints ? q->rp->c->urls[q->via]
                                                 : q->rp->c->url;
            q->worker = kvr_bench_tally_add(&q->rp->run->workers, name, 1);
            if (q->worker < 0)
                q->rp->oom = true;
            run_gauge(q->rp, q->worker, +1, kvr_now_ns());
        }
        return len;
    }
    const char *colon = memchr(buf, ':', len);
    if (!colon)
        return len;
    size_t nlen = (size_t)(colon - buf);
    const char *v = colon + 1, *end = buf + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
        end--;
    size_t vlen = (size_t)(end - v);
    char *dst = NULL;
    size_t cap = 0;
    if (nlen == 16 && strncasecmp(buf, "x-kvroute-worker", 16) == 0) {
        dst = q->worker_name;
        cap = sizeof(q->worker_name);
    } else if (nlen == 18 && strncasecmp(buf, "x-kvroute-decision", 18) == 0) {
        dst = q->decision;
        cap = sizeof(q->decision);
    }
    if (dst) {
        size_t k = vlen < cap - 1 ? vlen : cap - 1;
        memcpy(dst, v, k);
        dst[k] = '\0';
    }
    return len;
}

static int sse_cb(void *ud, const char *event, const char *data, size_t len)
{
    req_t *q = ud;
    if (event[0] && strcmp(event, "error") == 0)
        q->stream.error = true;
    if (kvr_bench_stream_event(&q->stream, data, len))
        q->first_ns = kvr_now_ns();
    return 0;
}

static size_t write_cb(char *buf, size_t size, size_t n, void *ud)
{
    req_t *q = ud;
    size_t len = size * n;
    if (q->status < 200 || q->status >= 300) {
        /* Keep the start of an error body for the log; excess is dropped, not an error. */
        if (q->errbody.len < 4096)
            kvr_buf_append(&q->errbody, buf, len < 4096 - q->errbody.len ? len : 4096 - q->errbody.len);
        return len;
    }
    if (kvr_sse_feed(&q->sse, buf, len) != 0)
        return CURL_WRITEFUNC_ERROR; /* an event over the cap: the worker is broken */
    return len;
}

static void req_free(req_t *q)
{
    if (!q)
        return;
    if (q->easy)
        curl_easy_cleanup(q->easy);
    curl_slist_free_all(q->headers);
    kvr_buf_free(&q->body);
    kvr_buf_free(&q->errbody);
    kvr_sse_free(&q->sse);
    free(q);
}

static int launch(replay_t *rp, uint32_t si)
{
    const kvr_bench_config *c = rp->c;
    req_t *q = calloc(1, sizeof(*q));
    if (!q)
        return -1;
    size_t n = rp->t->nsessions, ts = si % n;
    uint32_t copy = (uint32_t)(si / n);
    q->rp = rp;
    q->session = si;
    q->turn = rp->next_turn[si];
    q->worker = -1;
    q->bypass = kvr_bench_bypass_pick(c->seed, si, q->turn, c->bypass_share, c->nbypass_workers);
    if (rp->nendpoints)
        q->via = c->spread_random ? kvr_bench_spread_pick(c->seed, si, q->turn, rp->nendpoints)
                                  : rp->spread_next++ % rp->nendpoints;
    kvr_bench_body_opts bo = rp->body_opts;
    bo.variant = kvr_bench_variant(c->pass, copy);
    kvr_buf_init(&q->body, 0);
    kvr_buf_init(&q->errbody, 0);
    kvr_sse_init(&q->sse, c->max_event_bytes, sse_cb, q);
    kvr_bench_stream_init(&q->stream);
    if (kvr_bench_body(rp->t, ts, q->turn, &bo, &q->body) < 0)
        goto fail;
    q->headers = curl_slist_append(q->headers, "Content-Type: application/json");
    q->headers = curl_slist_append(q->headers, "Accept: text/event-stream");
    q->headers = curl_slist_append(q->headers, "Expect:");
    if (c->api_key) {
        char auth[1024];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", c->api_key);
        q->headers = curl_slist_append(q->headers, auth);
    }
    if (rp->header[ts]) {
        char h[600];
        if (bo.variant)
            snprintf(h, sizeof(h), "x-session-id: s%llu-%s-%llx", (unsigned long long)c->seed,
                     rp->t->sessions[ts].name, (unsigned long long)bo.variant);
        else
            snprintf(h, sizeof(h), "x-session-id: s%llu-%s", (unsigned long long)c->seed,
                     rp->t->sessions[ts].name);
        q->headers = curl_slist_append(q->headers, h);
        q->session_header = true;
    }
    if (!q->headers)
        goto fail;
    q->easy = curl_easy_init();
    if (!q->easy)
        goto fail;
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, q->bypass >= 0   ? rp->bypass_endpoints[q->bypass]
                                     : rp->nendpoints ? rp->endpoints[q->via]
                                                      : rp->endpoint);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body.data);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body.len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, q);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, c->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "kvroute-bench");
    q->t0_ns = kvr_now_ns();
    if (curl_multi_add_handle(rp->multi, e) != CURLM_OK)
        goto fail;
    q->next = rp->live;
    if (rp->live)
        rp->live->prev = q;
    rp->live = q;
    rp->inflight++;
    rp->sent++;
    return 0;
fail:
    req_free(q);
    return -1;
}

static const char *curl_kind(CURLcode rc)
{
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return "timeout";
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
        return "connect";
    case CURLE_WRITE_ERROR:
        return "bad_stream";
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
        return "transfer";
    case CURLE_ABORTED_BY_CALLBACK:
        return "aborted";
    default:
        return NULL;
    }
}

/* Next turn of a session after one finished: schedule it, or close the session. */
static void session_next(replay_t *rp, uint32_t si, uint64_t now)
{
    const kvr_bench_session *s = &rp->t->sessions[si % rp->t->nsessions];
    rp->next_turn[si]++;
    if (rp->next_turn[si] < s->nturns) {
        double think = kvr_bench_think_ms(rp->c->seed, si, rp->next_turn[si], rp->c->think_ms) *
                       rp->c->time_scale;
        if (heap_push(&rp->heap, now + (uint64_t)(think * 1e6), si) < 0)
            rp->oom = true;
        return;
    }
    rp->active--;
    rp->sessions_done++;
    if (rp->c->mode == KVR_BENCH_MODE_CONCURRENCY && rp->next_session < rp->nsess) {
        if (heap_push(&rp->heap, now, (uint32_t)rp->next_session++) < 0)
            rp->oom = true;
        rp->active++;
    }
}

static void unlink_req(replay_t *rp, req_t *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        rp->live = q->next;
    if (q->next)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void finish(replay_t *rp, req_t *q, CURLcode rc)
{
    unlink_req(rp, q);
    uint64_t now = kvr_now_ns();
    kvr_bench_run *run = rp->run;
    kvr_bench_record *r = &run->records[run->nrecords++];
    memset(r, 0, sizeof(*r));
    r->session = (uint32_t)(q->session % rp->t->nsessions);
    r->copy = (uint32_t)(q->session / rp->t->nsessions);
    r->pass = rp->c->pass;
    r->turn = q->turn;
    r->status = q->status;
    r->session_header = q->session_header;
    r->bypassed = q->bypass >= 0;
    r->worker = q->worker;
    r->start_s = (double)(q->t0_ns - run->start_ns) / 1e9;
    r->e2e_s = (double)(now - q->t0_ns) / 1e9;
    r->ttft_s = q->stream.first_content ? (double)(q->first_ns - q->t0_ns) / 1e9 : NAN;
    r->prompt_tokens = q->stream.usage ? q->stream.prompt_tokens : -1;
    r->cached_tokens = q->stream.usage ? q->stream.cached_tokens : -1;
    r->completion_tokens = q->stream.usage ? q->stream.completion_tokens : -1;
    r->decision = q->decision[0] ? kvr_bench_tally_add(&run->decisions, q->decision, 1) : -1;
    if (q->worker >= 0)
        run_gauge(rp, q->worker, -1, now);

    char kind[48] = "";
    if (rc != CURLE_OK) {
        const char *k = curl_kind(rc);
        if (k)
            snprintf(kind, sizeof(kind), "%s", k);
        else
            snprintf(kind, sizeof(kind), "curl_%d", (int)rc);
    } else if (q->status < 200 || q->status >= 300) {
        snprintf(kind, sizeof(kind), "http_%d", q->status);
    } else if (q->stream.error) {
        snprintf(kind, sizeof(kind), "stream_error");
    } else if (q->stream.bad_json) {
        snprintf(kind, sizeof(kind), "bad_json");
    } else if (!q->stream.usage) {
        snprintf(kind, sizeof(kind), "no_usage");
    } else if (!q->stream.done) {
        snprintf(kind, sizeof(kind), "no_done");
    }
    r->error = -1;
    if (kind[0]) {
        r->error = kvr_bench_tally_add(&run->errors, kind, 1);
        /* The first error of each kind is worth a line: it says why. */
        if (r->error >= 0 && run->errors.counts[r->error] == 1)
            fprintf(stderr, "%skvroute-bench: first %s error (session %s turn %u): %s%.300s\n",
                    rp->c->progress == 2 ? "\n" : "", kind,
                    rp->t->sessions[q->session % rp->t->nsessions].name,
                    q->turn, rc != CURLE_OK ? curl_easy_strerror(rc) : "",
                    q->errbody.data ? q->errbody.data : "");
    }
    rp->inflight--;
    session_next(rp, q->session, now);
}

static void progress(replay_t *rp, bool final)
{
    const kvr_bench_config *c = rp->c;
    if (!c->progress)
        return;
    uint64_t now = kvr_now_ns();
    uint64_t every = c->progress == 2 ? 200000000ull : 10000000000ull;
    if (!final && now - rp->last_progress_ns < every)
        return;
    rp->last_progress_ns = now;
    double el = (double)(now - rp->run->start_ns) / 1e9;
    size_t done = rp->run->nrecords, total = rp->run->planned;
    uint64_t errs = kvr_bench_tally_total(&rp->run->errors);
    double rate = el > 0 ? (double)done / el : 0;
    if (c->progress == 2) {
        char bar[31];
        size_t fill = total ? done * 30 / total : 0;
        for (size_t i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %zu/%zu done  %llu errors  %zu in flight  %.1f req/s  %.1fs ", bar,
                done, total, (unsigned long long)errs, rp->inflight, rate, el);
        if (final)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "kvroute-bench: %zu/%zu done, %llu errors, %zu in flight, %.1f req/s, %.1fs\n",
                done, total, (unsigned long long)errs, rp->inflight, rate, el);
    }
    fflush(stderr);
}

static int validate(const kvr_bench_trace *t, const kvr_bench_config *c, char *err, size_t errlen)
{
    if (!c->url || !c->model) {
        snprintf(err, errlen, "url and model are required");
        return -1;
    }
    if (c->mode == KVR_BENCH_MODE_CONCURRENCY && c->concurrency < 1) {
        snprintf(err, errlen, "--concurrency must be at least 1");
        return -1;
    }
    if (c->mode == KVR_BENCH_MODE_RATE && !(c->rate > 0)) {
        snprintf(err, errlen, "--rate must be positive");
        return -1;
    }
    if (c->mode == KVR_BENCH_MODE_TIMESTAMPS && !t->has_timestamps) {
        snprintf(err, errlen,
                 "the %s trace has no timestamps; use --concurrency or --rate",
                 kvr_bench_format_name(t->format));
        return -1;
    }
    if (t->nsessions == 0 || (c->sessions && c->mode == KVR_BENCH_MODE_TIMESTAMPS)) {
        snprintf(err, errlen, "no sessions to replay, or copies of sessions with --timestamps");
        return -1;
    }
    if (!(c->slo_ttft_ms >= 0) || !(c->slo_itl_ms >= 0)) {
        snprintf(err, errlen, "bad SLO");
        return -1;
    }
    if (!(c->time_scale >= 0) || c->max_inflight < 1 || t->nsessions > UINT32_MAX ||
        c->sessions > UINT32_MAX) {
        snprintf(err, errlen, "bad --time-scale or --max-inflight");
        return -1;
    }
    if (!(c->bypass_share >= 0 && c->bypass_share <= 1) ||
        (c->bypass_share > 0 && (!c->bypass_workers || c->nbypass_workers == 0))) {
        snprintf(err, errlen, "--bypass-share is 0..1 and needs at least one --bypass-worker");
        return -1;
    }
    return 0;
}

int kvr_bench_replay(const kvr_bench_trace *t, const kvr_bench_config *c, kvr_bench_run *out,
                     char *err, size_t errlen)
{
    if (!c->append)
        memset(out, 0, sizeof(*out));
    if (validate(t, c, err, errlen) < 0)
        return -1;
    replay_t rp = {.t = t, .c = c, .run = out};
    rp.nsess = c->sessions ? c->sessions : t->nsessions;
    out->model_per_wall = c->time_scale > 0 ? 1.0 / c->time_scale : 1.0;
    out->slo_ttft_s = c->slo_ttft_ms / 1e3;
    out->slo_itl_s = c->slo_itl_ms / 1e3;
    rp.body_opts = (kvr_bench_body_opts){.model = c->model,
                                         .max_tokens_cap = c->max_tokens_cap,
                                         .default_max_tokens = c->default_max_tokens,
                                         .seed = c->seed,
                                         .ignore_eos = c->ignore_eos};
    size_t ulen = strlen(c->url);
    while (ulen && c->url[ulen - 1] == '/')
        ulen--;
    snprintf(rp.endpoint, sizeof(rp.endpoint), "%.*s/v1/chat/completions", (int)ulen, c->url);
    int rc = -1;
    if (c->nurls > 1) {
        rp.endpoints = calloc(c->nurls, sizeof(*rp.endpoints));
        for (size_t i = 0; rp.endpoints && i < c->nurls; i++) {
            const char *u = c->urls[i];
            size_t n = strlen(u);
            while (n && u[n - 1] == '/')
                n--;
            if (asprintf(&rp.endpoints[i], "%.*s/v1/chat/completions", (int)n, u) < 0) {
                rp.endpoints[i] = NULL;
                rp.oom = true;
            }
        }
        if (!rp.endpoints || rp.oom) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        rp.nendpoints = c->nurls;
    }
    if (c->bypass_share > 0) {
        rp.bypass_endpoints = calloc(c->nbypass_workers, sizeof(*rp.bypass_endpoints));
        for (size_t i = 0; rp.bypass_endpoints && i < c->nbypass_workers; i++) {
            const char *u = c->bypass_workers[i];
            size_t n = strlen(u);
            while (n && u[n - 1] == '/')
                n--;
            if (asprintf(&rp.bypass_endpoints[i], "%.*s/v1/chat/completions", (int)n, u) < 0) {
                rp.bypass_endpoints[i] = NULL;
                rp.oom = true;
            }
        }
        if (!rp.bypass_endpoints || rp.oom) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
    }
    size_t planned = 0;
    for (size_t v = 0; v < rp.nsess; v++)
        planned += t->sessions[v % t->nsessions].nturns;
    kvr_bench_record *recs = realloc(out->records, (out->nrecords + planned + 1) * sizeof(*recs));
    if (recs)
        out->records = recs;
    out->planned += planned;
    rp.header = calloc(t->nsessions ? t->nsessions : 1, sizeof(*rp.header));
    rp.next_turn = calloc(rp.nsess, sizeof(*rp.next_turn));
    rp.multi = curl_multi_init();
    if (!recs || !rp.header || !rp.next_turn || !rp.multi ||
        kvr_bench_pick_header_sessions(t->nsessions,
                                       kvr_bench_format_is_conversation(t->format)
                                           ? c->session_header_share
                                           : 0,
                                       c->seed, rp.header) < 0) {
        snprintf(err, errlen, "out of memory or libcurl failed to start");
        goto done;
    }
    curl_multi_setopt(rp.multi, CURLMOPT_MAXCONNECTS, (long)c->max_inflight);
    uint64_t t0 = kvr_now_ns();
    if (!out->start_ns)
        out->start_ns = t0;
    rp.last_progress_ns = t0;

    /* Initial schedule. */
    if (c->mode == KVR_BENCH_MODE_CONCURRENCY) {
        while (rp.next_session < rp.nsess && rp.active < c->concurrency) {
            heap_push(&rp.heap, t0, (uint32_t)rp.next_session++);
            rp.active++;
        }
    } else {
        double at_s = 0;
        for (size_t i = 0; i < rp.nsess; i++) {
            /* at_s: model seconds since the start; wall = model × time scale. */
            if (c->mode == KVR_BENCH_MODE_RATE) {
                if (i)
                    at_s += -log1p(-unit(c->seed ^ 0xa7, i, c->pass)) / c->rate;
            } else {
                int64_t ms = t->sessions[i].turns[0].at_ms;
                at_s = ms < 0 ? 0 : (double)ms / 1e3;
            }
            if (heap_push(&rp.heap, t0 + (uint64_t)(at_s * c->time_scale * 1e9), (uint32_t)i) < 0)
                rp.oom = true;
        }
        rp.active = rp.nsess;
    }

    while (!rp.oom) {
        bool stopping = c->stop && *c->stop;
        uint64_t now = kvr_now_ns();
        while (!stopping && rp.heap.n && rp.heap.v[0].due_ns <= now && rp.inflight < c->max_inflight) {
            due_t d = heap_pop(&rp.heap);
            if (launch(&rp, d.session) < 0) {
                snprintf(err, errlen, "could not build or start a request (out of memory?)");
                rp.oom = true;
                break;
            }
        }
        if (stopping) {
            out->interrupted = rp.heap.n > 0 || rp.inflight > 0;
            break;
        }
        if (rp.inflight == 0 && rp.heap.n == 0)
            break;
        int running = 0;
        curl_multi_perform(rp.multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(rp.multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE)
                continue;
            req_t *q = NULL;
            CURL *e = m->easy_handle;
            CURLcode res = m->data.result;
            curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&q);
            curl_multi_remove_handle(rp.multi, e);
            finish(&rp, q, res);
            req_free(q);
        }
        progress(&rp, false);
        /* Sleep until a socket is ready, the next turn is due, or the progress bar is due. */
        long wait_ms = 200;
        now = kvr_now_ns();
        if (rp.heap.n && rp.inflight < c->max_inflight) {
            uint64_t due = rp.heap.v[0].due_ns;
            long ms = due <= now ? 0 : (long)((due - now + 999999) / 1000000);
            if (ms < wait_ms)
                wait_ms = ms;
        }
        if (wait_ms > 0)
            curl_multi_poll(rp.multi, NULL, 0, (int)wait_ms, NULL);
    }
    /* Abort whatever is still running (stop flag or out of memory). */
    while (rp.live) {
        req_t *q = rp.live;
        unlink_req(&rp, q);
        curl_multi_remove_handle(rp.multi, q->easy);
        if (q->worker >= 0)
            run_gauge(&rp, q->worker, -1, kvr_now_ns());
        req_free(q);
    }
    out->end_ns = kvr_now_ns();
    out->elapsed_s = (double)(out->end_ns - out->start_ns) / 1e9;
    progress(&rp, true);
    if (rp.oom) {
        if (!err[0])
            snprintf(err, errlen, "out of memory");
        goto done;
    }
    rc = 0;
done:
    if (rp.multi)
        curl_multi_cleanup(rp.multi);
    free(rp.heap.v);
    free(rp.header);
    free(rp.next_turn);
    for (size_t i = 0; rp.endpoints && i < c->nurls; i++)
        free(rp.endpoints[i]);
    free(rp.endpoints);
    for (size_t i = 0; rp.bypass_endpoints && i < c->nbypass_workers; i++)
        free(rp.bypass_endpoints[i]);
    free(rp.bypass_endpoints);
    return rc;
}

void kvr_bench_run_free(kvr_bench_run *r)
{
    free(r->records);
    free(r->inflight);
    kvr_bench_tally_free(&r->errors);
    kvr_bench_tally_free(&r->workers);
    kvr_bench_tally_free(&r->decisions);
    memset(r, 0, sizeof(*r));
}
