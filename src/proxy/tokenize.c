/* Token ids of a request (tokenize.h): the synchronous sources, a digest-keyed LRU cache, and
 * POST /tokenize on the upstream client under a deadline of our own (the client's first-byte
 * timeout is sized for prefill, far too long for a routing decision).
 *
 * Lifetimes: an operation owns a uv timer, so its memory goes only in the timer's close
 * callback; ending it (answer, failure, timeout, cancel, tokenizer free) first cancels its
 * attempt and unlinks it, so nothing reaches it afterwards. That close callback never touches
 * the tokenizer, which may therefore be freed while closes are pending. The user callback is
 * always the last thing an answer does, so it may free the tokenizer (it must not read `ids`
 * after that: a cached answer's ids belong to the cache). */
#include "proxy/tokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/xxh.h"

#include "util/buf.h"
#include "util/json_read.h"
#include "util/rand.h"

/* A /tokenize reply of 1 M ids is ~8 MiB of JSON; more is not an answer worth waiting for. */
#define REPLY_CAP (8u * 1024u * 1024u)

/* Members of the client's body that change what the worker renders (vLLM's Tokenize*Request
 * take the same names as the generation requests): copied byte for byte, so /tokenize sees
 * what generation will. The completion form takes only the first. */
static const char *const extras[] = {"add_special_tokens", "add_generation_prompt",
                                     "continue_final_message", "chat_template",
                                     "chat_template_kwargs"};

typedef struct centry {
    XXH128_hash_t key;
    uint32_t *ids;
    size_t n;
    struct centry *hnext;       /* bucket chain */
    struct centry *prev, *next; /* LRU: head is the most recently used */
} centry;

struct kvr_tokenizer {
    kvr_upstream *up;
    uv_loop_t *loop;
    kvr_tokenize_cfg cfg;
    uint64_t seed; /* random, so nobody crafts colliding prompts offline */
    centry **buckets;
    size_t nbuckets; /* power of two, or 0 */
    centry *head, *tail;
    size_t count, bytes;
    kvr_tokenize_op *live; /* ops in flight, so free can end them */
    uint64_t by_source[KVR_TOK_NSOURCES];
};

struct kvr_tokenize_op {
    uv_timer_t timer;
    kvr_tokenizer *t;
    kvr_tokenize_op *prev, *next;
    kvr_upstream_attempt *att;
    kvr_buf body;  /* the request body: the attempt reads it until it ends */
    kvr_buf reply;
    int status;
    int cacheable;
    int done;
    XXH128_hash_t key;
    kvr_tokenize_cb cb;
    void *ud;
};

const char *kvr_tokenize_source_name(kvr_tokenize_source s)
{
    static const char *const names[KVR_TOK_NSOURCES] = {
        "header", "prompt_ids", "cache", "worker", "timeout", "failed", "none"};
    return (unsigned)s < KVR_TOK_NSOURCES ? names[s] : "unknown";
}

long kvr_tokenize_parse_ids(const char *s, size_t len, uint32_t *out, size_t max)
{
    long count = 0;
    size_t i = 0;
    for (;;) {
        while (i < len && (s[i] == ' ' || s[i] == '\t'))
            i++;
        uint64_t v = 0;
        size_t d = i;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
            v = v * 10 + (uint64_t)(s[i] - '0');
            if (v > UINT32_MAX)
                return -1;
        }
        if (i == d)
            return -1;
        if ((size_t)count < max)
            out[count] = (uint32_t)v;
        count++;
        while (i < len && (s[i] == ' ' || s[i] == '\t'))
            i++;
        if (i == len)
            return count;
        if (s[i++] != ',')
            return -1;
    }
}

/* ---- cache ---- */

static int key_eq(XXH128_hash_t a, XXH128_hash_t b)
{
    return a.low64 == b.low64 && a.high64 == b.high64;
}

static centry **bucket_of(kvr_tokenizer *t, XXH128_hash_t k)
{
    return &t->buckets[k.low64 & (t->nbuckets - 1)];
}

static void lru_unlink(kvr_tokenizer *t, centry *e)
{
    *(e->prev ? &e->prev->next : &t->head) = e->next;
    *(e->next ? &e->next->prev : &t->tail) = e->prev;
}

static void lru_push(kvr_tokenizer *t, centry *e)
{
    e->prev = NULL;
    e->next = t->head;
    *(t->head ? &t->head->prev : &t->tail) = e;
    t->head = e;
}

static centry *cache_find(kvr_tokenizer *t, XXH128_hash_t k)
{
    if (!t->nbuckets)
        return NULL;
    centry *e = *bucket_of(t, k);
    while (e && !key_eq(e->key, k))
        e = e->hnext;
    return e;
}

static void cache_drop(kvr_tokenizer *t, centry *e)
{
    centry **pp = bucket_of(t, e->key);
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(t, e);
    t->count--;
    t->bytes -= sizeof(*e) + e->n * sizeof(uint32_t);
    free(e->ids);
    free(e);
}

static void cache_trim(kvr_tokenizer *t, size_t max)
{
    while (t->count > max)
        cache_drop(t, t->tail);
}

/* Doubles the table once entries outnumber buckets; a failed grow only lengthens chains. */
static void cache_grow(kvr_tokenizer *t)
{
    size_t n = t->nbuckets ? t->nbuckets * 2 : 16;
    centry **b = calloc(n, sizeof(*b));
    if (!b)
        return;
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (centry *e = t->buckets[i], *next; e; e = next) {
            next = e->hnext;
            e->hnext = b[e->key.low64 & (n - 1)];
            b[e->key.low64 & (n - 1)] = e;
        }
    }
    free(t->buckets);
    t->bytes += (n - t->nbuckets) * sizeof(*b);
    t->buckets = b;
    t->nbuckets = n;
}

/* Takes `ids` when it returns 1; 0 leaves them with the caller (not cacheable or no memory). */
static int cache_put(kvr_tokenizer *t, XXH128_hash_t k, uint32_t *ids, size_t n)
{
    if (!t->cfg.cache_entries || !n || n > KVR_TOKENIZE_MAX_IDS)
        return 0;
    centry *e = cache_find(t, k); /* an identical miss answered first */
    if (e)
        cache_drop(t, e);
    cache_trim(t, t->cfg.cache_entries - 1);
    if (t->count >= t->nbuckets)
        cache_grow(t);
    if (!t->nbuckets || !(e = malloc(sizeof(*e))))
        return 0;
    *e = (centry){.key = k, .ids = ids, .n = n};
    centry **b = bucket_of(t, k);
    e->hnext = *b;
    *b = e;
    lru_push(t, e);
    t->count++;
    t->bytes += sizeof(*e) + n * sizeof(uint32_t);
    return 1;
}

/* ---- tokenizer ---- */

kvr_tokenizer *kvr_tokenizer_new(kvr_upstream *up, const kvr_tokenize_cfg *cfg)
{
    kvr_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        abort();
    t->up = up;
    t->loop = kvr_upstream_loop(up);
    t->cfg = *cfg;
    t->seed = kvr_rand_u64();
    return t;
}

void kvr_tokenizer_set_cfg(kvr_tokenizer *t, const kvr_tokenize_cfg *cfg)
{
    t->cfg = *cfg;
    cache_trim(t, cfg->cache_entries);
}

static void op_free(kvr_tokenize_op *op)
{
    kvr_buf_free(&op->body);
    kvr_buf_free(&op->reply);
    free(op);
}

static void op_closed(uv_handle_t *h)
{
    op_free(h->data);
}

/* Ends `op` without answering; its memory stays valid until the timer's close callback. */
static void op_end(kvr_tokenize_op *op)
{
    op->done = 1;
    *(op->prev ? &op->prev->next : &op->t->live) = op->next;
    if (op->next)
        op->next->prev = op->prev;
    if (op->att)
        kvr_upstream_cancel(op->att);
    op->att = NULL;
    uv_timer_stop(&op->timer);
    uv_close((uv_handle_t *)&op->timer, op_closed);
}

void kvr_tokenizer_free(kvr_tokenizer *t)
{
    if (!t)
        return;
    while (t->live)
        op_end(t->live);
    cache_trim(t, 0);
    free(t->buckets);
    free(t);
}

static void answer(kvr_tokenizer *t, kvr_tokenize_cb cb, void *ud, const uint32_t *ids, size_t n,
                   kvr_tokenize_source src)
{
    t->by_source[src]++;
    cb(ud, n ? ids : NULL, n, src);
}

/* `a` as a list of ids into *ids (malloc'd, or NULL when empty): its length, or -1 (and no
 * list) when `a` is not an array of integers in [0, 2^32) or memory ran out. */
static long ids_of(const json_t *a, uint32_t **ids)
{
    size_t n = json_array_size(a);
    *ids = n ? malloc(n * sizeof(**ids)) : NULL;
    long rc = json_is_array(a) && (*ids || !n) ? (long)n : -1;
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        json_t *v = json_array_get(a, i);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x > (json_int_t)UINT32_MAX)
            rc = -1;
        else
            (*ids)[i] = (uint32_t)x;
    }
    if (rc < 0) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

/* Ends `op` with `src`; for a worker answer, parses and caches the reply first. */
static void op_finish(kvr_tokenize_op *op, kvr_tokenize_source src)
{
    kvr_tokenizer *t = op->t;
    op_end(op);
    uint32_t *ids = NULL;
    long got = -1;
    if (src == KVR_TOK_WORKER && op->status >= 200 && op->status <= 299) {
        json_t *root = op->reply.len ? kvr_json_read(op->reply.data, op->reply.len, NULL) : NULL;
        got = ids_of(json_object_get(root, "tokens"), &ids);
        json_decref(root);
    }
    if (src == KVR_TOK_WORKER && got < 0) /* a non-2xx status or not {"tokens": [ids]} */
        src = KVR_TOK_FAILED;
    size_t n = got > 0 ? (size_t)got : 0;
    int kept = src == KVR_TOK_WORKER && op->cacheable && cache_put(t, op->key, ids, n);
    answer(t, op->cb, op->ud, ids, n, src);
    if (!kept)
        free(ids);
}

static void on_headers(void *ud, int status, const kvr_http_header *h, size_t n)
{
    (void)h;
    (void)n;
    ((kvr_tokenize_op *)ud)->status = status;
}

static int on_body(void *ud, const char *data, size_t len)
{
    kvr_tokenize_op *op = ud;
    if (kvr_buf_append(&op->reply, data, len) < 0)
        op_finish(op, KVR_TOK_FAILED); /* cancels the attempt: safe inside its callbacks */
    return 0;
}

static void on_done(void *ud, kvr_upstream_err err, const char *msg, int got_headers)
{
    (void)msg;
    (void)got_headers;
    kvr_tokenize_op *op = ud;
    op->att = NULL; /* the upstream module frees it after this call */
    op_finish(op, err == KVR_UP_OK                      ? KVR_TOK_WORKER
                  : err == KVR_UP_FIRST_BYTE_TIMEOUT ||
                          err == KVR_UP_IDLE_TIMEOUT ? KVR_TOK_TIMEOUT
                                                     : KVR_TOK_FAILED);
}

static void on_timeout(uv_timer_t *tm)
{
    op_finish(tm->data, KVR_TOK_TIMEOUT);
}

static const kvr_upstream_cbs up_cbs = {on_headers, on_body, on_done};

/* Appends `,"name":<value>` with the value's bytes exactly as the client sent them. */
static int put_member(kvr_buf *b, const char *name, const char *body, size_t len)
{
    size_t vlen;
    long at = kvr_json_member_span(body, len, name, &vlen);
    if (at < 0)
        return 0;
    return kvr_buf_printf(b, ",\"%s\":", name) < 0 ? -1 : kvr_buf_append(b, body + at, vlen);
}

/* `{"model":...` plus the template-affecting members: everything of the /tokenize body that
 * the cache key (the routing text) does not stand for, so it also goes into the digest. */
static int put_head(kvr_buf *b, const kvr_tokenize_req *r)
{
    int rc = kvr_buf_puts(b, "{\"model\":\""); /* "" (no model): vLLM takes its own */
    for (const char *m = r->model ? r->model : ""; !rc && *m; m++) {
        unsigned char c = (unsigned char)*m;
        rc = c == '"' || c == '\\' ? kvr_buf_printf(b, "\\%c", c)
             : c < 0x20            ? kvr_buf_printf(b, "\\u%04x", c)
                                   : kvr_buf_append(b, &c, 1);
    }
    rc = rc ? rc : kvr_buf_puts(b, "\"");
    for (size_t i = 0; !rc && i < (r->chat ? sizeof(extras) / sizeof(*extras) : 1); i++)
        rc = put_member(b, extras[i], r->body, r->body_len);
    size_t vl;
    if (!rc && r->chat && kvr_json_member_span(r->body, r->body_len, extras[1], &vl) < 0)
        rc = kvr_buf_puts(b, ",\"add_generation_prompt\":true"); /* as generation defaults */
    return rc;
}

/* The header or a prompt of token ids. Returns 1 when it answered. */
static int answer_given_ids(kvr_tokenizer *t, const kvr_tokenize_req *r, kvr_tokenize_cb cb,
                            void *ud, long pspan, size_t plen)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    kvr_tokenize_source src = KVR_TOK_HEADER;
    if (r->header_ids) {
        long c = kvr_tokenize_parse_ids(r->header_ids, r->header_len, NULL, 0);
        if (c < 0 || !(ids = malloc((size_t)c * sizeof(*ids))))
            src = KVR_TOK_FAILED;
        else
            n = (size_t)kvr_tokenize_parse_ids(r->header_ids, r->header_len, ids, (size_t)c);
    } else if (pspan >= 0 && r->body[pspan] == '[') {
        /* Only a flat list of ids is one prompt; strings or arrays inside make it a batch. */
        json_t *a = kvr_json_read(r->body + pspan, plen, NULL);
        long c = ids_of(a, &ids);
        json_decref(a);
        src = c > 0 ? KVR_TOK_PROMPT : KVR_TOK_NONE;
        n = c > 0 ? (size_t)c : 0;
    } else {
        return 0;
    }
    answer(t, cb, ud, ids, n, src);
    free(ids);
    return 1;
}

/* Starts the /tokenize call of `op` (body built). Returns 0, or -1 when it could not start: a
 * URL or key too long (limits as src/workers/probe.c and fetch.c), a URL that is not http(s),
 * bad key bytes, or no memory. */
static int op_start(kvr_tokenize_op *op, const char *worker_url, const char *api_key)
{
    kvr_tokenizer *t = op->t;
    char url[2048], auth[1100];
    size_t ul = strlen(worker_url);
    while (ul > 7 && worker_url[ul - 1] == '/') /* as kvr_worker_url(): "http://h:p/" */
        ul--;
    kvr_http_header h[2] = {{"Content-Type", 12, "application/json", 16},
                            {"Authorization", 13, auth, 0}};
    int n = snprintf(url, sizeof(url), "%.*s/tokenize", (int)ul, worker_url);
    if (api_key)
        h[1].value_len = (size_t)snprintf(auth, sizeof(auth), "Bearer %s", api_key);
    if (n < 0 || (size_t)n >= sizeof(url) || h[1].value_len >= sizeof(auth))
        return -1;
    /* libcurl copies the URL and headers at start; only the body must outlive this frame. */
    op->att = kvr_upstream_start(t->up, "POST", url, h, api_key ? 2 : 1, op->body.data,
                                 op->body.len, &up_cbs, op);
    if (!op->att)
        return -1;
    uv_timer_init(t->loop, &op->timer);
    op->timer.data = op;
    if (t->cfg.timeout_ms) /* 0 = no deadline of our own, as the upstream options' 0 */
        uv_timer_start(&op->timer, on_timeout, t->cfg.timeout_ms, 0);
    op->next = t->live;
    if (t->live)
        t->live->prev = op;
    t->live = op;
    return 0;
}

/* Answers at once, dropping `op` (not started, may be NULL). */
static kvr_tokenize_op *answer_now(kvr_tokenize_op *op, kvr_tokenizer *t, kvr_tokenize_cb cb,
                                   void *ud, kvr_tokenize_source src)
{
    if (op)
        op_free(op);
    answer(t, cb, ud, NULL, 0, src);
    return NULL;
}

kvr_tokenize_op *kvr_tokenize(kvr_tokenizer *t, const kvr_tokenize_req *r, kvr_tokenize_cb cb,
                              void *ud)
{
    size_t vlen = 0, tlen = 0;
    const char *what = r->chat ? "messages" : "prompt";
    long at = r->body && r->body_len ? kvr_json_member_span(r->body, r->body_len, what, &vlen)
                                     : -1;
    if (answer_given_ids(t, r, cb, ud, r->chat ? -1 : at, vlen))
        return NULL;
    if (at < 0 || (!r->chat && r->body[at] != '"'))
        return answer_now(NULL, t, cb, ud, KVR_TOK_NONE);
    kvr_tokenize_op *op = calloc(1, sizeof(*op));
    if (!op)
        return answer_now(NULL, t, cb, ud, KVR_TOK_FAILED);
    *op = (kvr_tokenize_op){.t = t, .cb = cb, .ud = ud,
                            .cacheable = r->cache_key && t->cfg.cache_entries};
    /* Every span copied is a distinct part of the body; 256 covers the names around them. */
    kvr_buf_init(&op->body, r->body_len + (r->model ? 6 * strlen(r->model) : 0) + 256);
    kvr_buf_init(&op->reply, REPLY_CAP);
    if (put_head(&op->body, r) < 0)
        return answer_now(op, t, cb, ud, KVR_TOK_FAILED);
    if (op->cacheable) {
        uint64_t s = XXH3_64bits_withSeed(op->body.data, op->body.len, t->seed ^ (unsigned)r->chat);
        op->key = XXH3_128bits_withSeed(r->cache_key, r->cache_key_len, s);
        centry *e = cache_find(t, op->key);
        if (e) {
            op_free(op);
            lru_unlink(t, e);
            lru_push(t, e);
            answer(t, cb, ud, e->ids, e->n, KVR_TOK_CACHE);
            return NULL;
        }
    }
    if (!r->worker_url)
        return answer_now(op, t, cb, ud, KVR_TOK_NONE);
    long tat = r->chat ? kvr_json_member_span(r->body, r->body_len, "tools", &tlen) : -1;
    if (kvr_buf_printf(&op->body, ",\"%s\":", what) < 0 ||
        kvr_buf_append(&op->body, r->body + at, vlen) < 0 ||
        (tat >= 0 && (kvr_buf_puts(&op->body, ",\"tools\":") < 0 ||
                      kvr_buf_append(&op->body, r->body + tat, tlen) < 0)) ||
        kvr_buf_puts(&op->body, "}") < 0 || op_start(op, r->worker_url, r->api_key) < 0)
        return answer_now(op, t, cb, ud, KVR_TOK_FAILED);
    return op;
}

void kvr_tokenize_cancel(kvr_tokenize_op *op)
{
    if (op && !op->done) /* done: inside its own callback, already ended */
        op_end(op);
}

void kvr_tokenize_stats_get(const kvr_tokenizer *t, kvr_tokenize_stats *out)
{
    memcpy(out->by_source, t->by_source, sizeof(out->by_source));
    out->cache_entries = t->count;
    out->cache_bytes = t->bytes;
}
