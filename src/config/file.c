/* The YAML config file (see kvr_config_file_load in config.h). The document is walked along
 * the schema only, never generically, so YAML aliases (even cyclic ones) cannot make the walk
 * recurse without bound. Every problem is reported with its position and the walk goes on, so
 * one run shows them all. */
#include "config/config.h"
#include "workers/registry.h"

#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "routing/policy.h"
#include "routing/scorers.h"

/* A config file is small; the cap keeps `--config /dev/zero` from eating the memory. */
#define MAX_FILE_BYTES ((size_t)64 << 20)
/* Longest key that can name a flag (the longest flag name is well under this). */
#define MAX_KEY 64

typedef struct {
    kvr_config *c;
    const char *path;
    kvr_errlist *errs;
    yaml_document_t *doc;
    const kvr_flag *flags, *route_flags;
    size_t nflags, nroute_flags;
} loader;

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const TOP_KEYS[] = {"listen",  "admin",  "auth",       "defaults",
                                       "workers", "routes", "egress", "rate_limits",
                                       "discovery", "redis"};
static const char *const DISCOVERY_KEYS[] = {"kubernetes"};
static const char *const K8S_KEYS[] = {"service",        "namespace",      "port",
                                       "kv_events_port", "kv_replay_port", "kv_topic",
                                       "data_parallel_size"};
static const char *const K8S_FLAGS[] = {"k8s-service",        "k8s-namespace",
                                        "k8s-port",           "k8s-kv-events-port",
                                        "k8s-kv-replay-port", "k8s-kv-topic",
                                        "k8s-data-parallel-size"};
static const char *const REDIS_KEYS[] = {"url", "key_prefix", "password_file"};
static const char *const REDIS_FLAGS[] = {"redis", "redis-key-prefix", "redis-password-file"};
static const char *const LISTEN_KEYS[] = {"host", "port"};
static const char *const LISTEN_FLAGS[] = {"host", "port"};
static const char *const ADMIN_KEYS[] = {"host", "port", "token_file"};
static const char *const ADMIN_FLAGS[] = {"admin-host", "admin-port", "admin-token-file"};
static const char *const AUTH_KEYS[] = {"api_keys_file"};
static const char *const AUTH_FLAGS[] = {"api-key-file"};
static const char *const EGRESS_KEYS[] = {"allow", "deny"};
static const char *const ROUTE_KEYS[] = {"name", "model", "aliases", "targets", "service", "pd"};
/* Global flags that make no sense in the file (or have a section instead): never suggested. */
static const char *const ARGV_ONLY[] = {"config", "check", "worker", "prefill", "decode",
                                        "api-key-file", "kv-events", "scorer"};
/* A route's `pd` mapping: each key is the route flag named "pd-" + key ('_' → '-'). */
static const char *const PD_KEYS[] = {"mode", "prefill_policy", "decode_policy"};
static const char *const PD_FLAGS[] = {"pd-mode", "pd-prefill-policy", "pd-decode-policy"};

/* Bounds of a rate: far above any real rate, low enough that a limiter may scale it (to
 * tokens per millisecond in fixed point, say) without overflowing 64 bits. */
#define MAX_RATE 1e12
/* The keys of one rate limit, as flag rows so that values are read (and refused) exactly like
 * the command line's numbers. */
static const kvr_flag LIMIT_FLAGS[] = {
    {.name = "requests-per-minute", .type = KVR_FLAG_U64,
     .off = offsetof(kvr_rate_limit_spec, requests_per_minute), .min = 0, .max = MAX_RATE},
    {.name = "tokens-per-minute", .type = KVR_FLAG_U64,
     .off = offsetof(kvr_rate_limit_spec, tokens_per_minute), .min = 0, .max = MAX_RATE},
};
/* A data-parallel engine's rank count (vLLM --data-parallel-size), and its KV-event ports
 * being per rank: read like flags, so values are refused as the command line's are. */
static const kvr_flag WORKER_DP_SIZE = {.name = "data-parallel-size", .type = KVR_FLAG_U32,
                                        .off = offsetof(kvr_worker_spec, data_parallel_size),
                                        .min = 1, .max = KVR_MAX_DP_SIZE};
static const kvr_flag KV_RANK_PORT_OFFSET = {.name = "rank-port-offset", .type = KVR_FLAG_BOOL,
                                             .off = offsetof(kvr_worker_spec,
                                                             kv_rank_port_offset)};
/* A worker's own cap, with --max-inflight's bounds. */
static const kvr_flag WORKER_MAX_INFLIGHT = {.name = "max-inflight", .type = KVR_FLAG_U32,
                                             .off = offsetof(kvr_worker_spec, max_inflight),
                                             .min = 0, .max = 1e9};
/* A prefill worker's SGLang bootstrap port. */
static const kvr_flag WORKER_BOOTSTRAP_PORT = {.name = "bootstrap-port", .type = KVR_FLAG_U32,
                                               .off = offsetof(kvr_worker_spec, bootstrap_port),
                                               .min = 1, .max = 65535};

__attribute__((format(printf, 3, 4))) static void fail(loader *l, const yaml_node_t *at,
                                                       const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvr_errlist_add(l->errs, "%s:%zu:%zu: %s", l->path, at->start_mark.line + 1,
                    at->start_mark.column + 1, msg);
}

static const char *text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* Scalars may hold a NUL (a "\0" escape): such a key never equals a C string. */
static int is(const yaml_node_t *k, const char *s)
{
    return k->data.scalar.length == strlen(s) && memcmp(k->data.scalar.value, s, strlen(s)) == 0;
}

/* The loader does not resolve tags: a plain scalar is null by its text, as YAML says. */
static int is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE)
        return 0;
    const char *v = text(n);
    return (n->tag && !strcmp((const char *)n->tag, YAML_NULL_TAG)) ||
           (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            (!*v || !strcmp(v, "~") || !strcasecmp(v, "null")));
}

static size_t nitems(const yaml_node_t *seq)
{
    return (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
}

/* `v` (the value of key `k`, or an item of its list) has type `t`, else reported. */
static int want(loader *l, const yaml_node_t *k, const yaml_node_t *v, yaml_node_type_t t)
{
    if (v->type == t && !is_null(v))
        return 1;
    if (is_null(v))
        fail(l, v, "%s: expected a value", text(k));
    else
        fail(l, v, "%s: expected %s", text(k),
             t == YAML_MAPPING_NODE ? "a mapping" : t == YAML_SEQUENCE_NODE ? "a list" : "a scalar");
    return 0;
}

/* The scalar text of `v` (borrowed from the document), or NULL once reported. Names and URLs
 * (`nonempty`) cannot be "". */
static const char *scalar(loader *l, const yaml_node_t *k, const yaml_node_t *v, int nonempty)
{
    if (!want(l, k, v, YAML_SCALAR_NODE))
        return NULL;
    if (memchr(v->data.scalar.value, '\0', v->data.scalar.length)) {
        fail(l, v, "%s: value contains a NUL byte", text(k));
        return NULL;
    }
    if (nonempty && !v->data.scalar.length) {
        fail(l, v, "%s: expected a value", text(k));
        return NULL;
    }
    return text(v);
}

static const char *keep(loader *l, const char *s)
{
    return kvr_config_strndup(l->c, s, strlen(s));
}

/* Edit distance to `b`, a known key (at most MAX_KEY long). */
static size_t distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b), row[MAX_KEY + 1];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Makes `cand` the best so far when it is closer to `key` than *bestd. */
static int consider(const char *key, size_t len, const char *cand, size_t *bestd)
{
    size_t lc = strlen(cand);
    /* The length difference bounds the distance: skip the work for hopeless (long) keys. */
    if ((len > lc ? len - lc : lc - len) >= *bestd)
        return 0;
    size_t d = distance(key, len, cand);
    if (d >= *bestd)
        return 0;
    *bestd = d;
    return 1;
}

static int argv_only(const char *flag)
{
    for (size_t i = 0; i < COUNT(ARGV_ONLY); i++)
        if (!strcmp(flag, ARGV_ONLY[i]))
            return 1;
    return 0;
}

/* Reports unknown key `k`, suggesting the closest of `names` and the rows of `table` (written
 * with underscores, as in the file) when one is close enough to be a typo. */
static void unknown(loader *l, const yaml_node_t *k, const char *const *names, size_t n,
                    const kvr_flag *table, size_t nt)
{
    size_t len = k->data.scalar.length, bestd = (len / 3 > 2 ? len / 3 : 2) + 1;
    char buf[MAX_KEY + 1], best[MAX_KEY + 1] = "";
    for (size_t i = 0; i < n; i++)
        if (consider(text(k), len, names[i], &bestd))
            snprintf(best, sizeof(best), "%s", names[i]);
    for (size_t i = 0; i < nt; i++) {
        size_t j = 0;
        if (argv_only(table[i].name) || strlen(table[i].name) > MAX_KEY)
            continue;
        for (; table[i].name[j]; j++)
            buf[j] = table[i].name[j] == '-' ? '_' : table[i].name[j];
        buf[j] = '\0';
        if (consider(text(k), len, buf, &bestd))
            memcpy(best, buf, j + 1);
    }
    /* A very short key is "close" to any short name: require something of it to survive. */
    if (best[0] && bestd < len)
        fail(l, k, "unknown key '%s' (did you mean '%s'?)", text(k), best);
    else
        fail(l, k, "unknown key '%s'", text(k));
}

/* The row of `table` that key `k` names (its '_' written '-'). A key written with '-' is not
 * one: the file's spelling is underscores only, and the did-you-mean says so. */
static const kvr_flag *flag_for(const yaml_node_t *k, const kvr_flag *table, size_t n)
{
    char name[MAX_KEY + 1];
    size_t len = k->data.scalar.length;
    if (len > MAX_KEY || memchr(text(k), '-', len) || memchr(text(k), '\0', len))
        return NULL;
    for (size_t i = 0; i < len; i++)
        name[i] = text(k)[i] == '_' ? '-' : text(k)[i];
    name[len] = '\0';
    return kvr_flags_find(table, n, name);
}

/* Sets flag `f` of `target` from value `v` of key `k` as the command line would, with the
 * message's "--flag" written as the key. Returns the value (in the arena), NULL on error. */
static const char *apply(loader *l, const kvr_flag *f, void *target, const yaml_node_t *k,
                         const yaml_node_t *v)
{
    const char *s = scalar(l, k, v, 0);
    if (!s)
        return NULL;
    /* Checked before setting so that an unknown policy never lands in the config. */
    if (!strcmp(f->name, "policy") && !kvr_policy_find(s)) {
        fail(l, v, "%s: unknown policy '%s' (one of %s)", text(k), s, kvr_policy_names());
        return NULL;
    }
    /* STR and custom rows keep the pointer: it must outlive the document. */
    s = keep(l, s);
    char err[512];
    if (kvr_flags_set(f, target, s, err, sizeof(err)) == 0)
        return s;
    size_t nl = strlen(f->name);
    if (!strncmp(err, "--", 2) && !strncmp(err + 2, f->name, nl))
        fail(l, v, "%s%s", text(k), err + 2 + nl);
    else
        fail(l, v, "%s: %s", text(k), err);
    return NULL;
}

static void weight(loader *l, const yaml_node_t *k, const yaml_node_t *v, double *out)
{
    const char *s = scalar(l, k, v, 0);
    char *end = NULL;
    errno = 0;
    double d = s ? strtod(s, &end) : 0;
    if (s && (end == s || *end || errno || !isfinite(d) || !(d > 0)))
        fail(l, v, "%s: bad value '%s' (expected a number > 0)", text(k), s);
    else if (s)
        *out = d;
}

/* Pair `p` of mapping `m`, when its key is a scalar not seen earlier in `m` (else reported:
 * a duplicate is skipped rather than silently overriding the first). */
static int pair(loader *l, const yaml_node_t *m, const yaml_node_pair_t *p, yaml_node_t **k,
                yaml_node_t **v)
{
    *k = yaml_document_get_node(l->doc, p->key);
    *v = yaml_document_get_node(l->doc, p->value);
    if (!*k || !*v)
        return 0;
    if ((*k)->type != YAML_SCALAR_NODE) {
        fail(l, *k, "expected a scalar key");
        return 0;
    }
    for (const yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
        const yaml_node_t *e = yaml_document_get_node(l->doc, q->key);
        if (e && e->type == YAML_SCALAR_NODE && e->data.scalar.length == (*k)->data.scalar.length &&
            !memcmp(e->data.scalar.value, (*k)->data.scalar.value, e->data.scalar.length)) {
            fail(l, *k, "duplicate key '%s' (first at line %zu)", text(*k), e->start_mark.line + 1);
            return 0;
        }
    }
    return 1;
}

#define EACH_PAIR(m, p)                                                                        \
    for (const yaml_node_pair_t *p = (m)->data.mapping.pairs.start;                            \
         p < (m)->data.mapping.pairs.top; p++)
#define ITEM(l, seq, i) yaml_document_get_node((l)->doc, (seq)->data.sequence.items.start[i])
#define LINE(n) ((int)(n)->start_mark.line + 1)
#define COL(n) ((int)(n)->start_mark.column + 1)

/* The pipeline's `scorers`: a mapping {NAME: WEIGHT} (or the route row's own
 * "NAME=WEIGHT,..." scalar), handed to the route table's `scorers` row as that string so that
 * it is checked exactly as --scorer is. Returns the string (in the arena), NULL once reported. */
static const char *apply_scorers(loader *l, const kvr_flag *f, void *target, const yaml_node_t *k,
                                 const yaml_node_t *v)
{
    if (v->type == YAML_SCALAR_NODE && !is_null(v))
        return apply(l, f, target, k, v);
    if (!want(l, k, v, YAML_MAPPING_NODE))
        return NULL;
    char buf[512], err[512];
    size_t at = 0;
    int ok = 1;
    buf[0] = '\0';
    yaml_node_t *kk, *vv;
    EACH_PAIR(v, p) {
        if (!pair(l, v, p, &kk, &vv)) {
            ok = 0;
            continue;
        }
        const char *w = scalar(l, kk, vv, 1);
        char one[256];
        double scratch[KVR_NSCORERS];
        if (w && kvr_scorer_find(text(kk), kk->data.scalar.length) < 0) {
            fail(l, kk, "%s: unknown scorer '%s' (one of prefix, session, load, queue, kv_usage, "
                 "weight, lmcache)", text(k), text(kk));
            w = NULL;
        } else if (w) {
            /* Each weight checked alone, so that every bad one is reported at its position. */
            snprintf(one, sizeof(one), "%s=%s", text(kk), w);
            if (strpbrk(w, ",=") || kvr_scorers_parse(one, scratch, 1, err, sizeof(err)) < 0) {
                fail(l, vv, "%s: %s: bad weight '%s' (expected a number 0..1e6)", text(k),
                     text(kk), w);
                w = NULL;
            }
        }
        int n = w ? snprintf(buf + at, sizeof(buf) - at, "%s%s", at ? "," : "", one) : 0;
        if (n < 0 || (size_t)n >= sizeof(buf) - at) {
            fail(l, vv, "%s: too long", text(k));
            return NULL;
        }
        at += (size_t)n;
        ok &= w != NULL;
    }
    if (!ok)
        return NULL;
    const char *s = keep(l, buf);
    if (kvr_flags_set(f, target, s, err, sizeof(err)) == 0)
        return s;
    size_t nl = strlen(f->name);
    fail(l, v, "%s%s", text(k), !strncmp(err, "--", 2) ? err + 2 + nl : err);
    return NULL;
}

/* A per-route key's value into `target` (a kvr_route_cfg): `scorers` is a mapping, every other
 * one a scalar. */
static const char *apply_route_key(loader *l, const kvr_flag *f, void *target,
                                   const yaml_node_t *k, const yaml_node_t *v)
{
    return !strcmp(f->name, "scorers") ? apply_scorers(l, f, target, k, v)
                                       : apply(l, f, target, k, v);
}

/* The pairs of a `pd: {mode, prefill_policy, decode_policy}` mapping: `each` gets the index of
 * each known key in PD_KEYS (PD_FLAGS names its flag); unknown keys are reported here. */
static void pd_walk(loader *l, const yaml_node_t *k, const yaml_node_t *m,
                    void (*each)(loader *l, size_t i, const yaml_node_t *kk, const yaml_node_t *v,
                                 void *ctx),
                    void *ctx)
{
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return;
    yaml_node_t *kk, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &kk, &v))
            continue;
        size_t i = 0;
        while (i < COUNT(PD_KEYS) && !is(kk, PD_KEYS[i]))
            i++;
        if (i == COUNT(PD_KEYS))
            unknown(l, kk, PD_KEYS, COUNT(PD_KEYS), NULL, 0);
        else
            each(l, i, kk, v, ctx);
    }
}

/* `defaults: {pd: {mode, prefill_policy, decode_policy}}`: the route flags pd-mode,
 * pd-prefill-policy and pd-decode-policy of every route's defaults (`ctx`). */
static void pd_default(loader *l, size_t i, const yaml_node_t *kk, const yaml_node_t *v,
                       void *ctx)
{
    const kvr_flag *f = kvr_flags_find(l->route_flags, l->nroute_flags, PD_FLAGS[i]);
    if (f)
        apply_route_key(l, f, ctx, kk, v);
}

/* A mapping of flags into `target`: `listen`, `admin`, `auth` (fixed `keys`, each naming one of
 * `flags` of the global table), or `defaults` (keys NULL: the route table's names). */
static void settings(loader *l, const yaml_node_t *k, const yaml_node_t *m, void *target,
                     const char *const *keys, const char *const *flags, size_t n)
{
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return;
    yaml_node_t *kk, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &kk, &v))
            continue;
        size_t i = 0;
        while (keys && i < n && !is(kk, keys[i]))
            i++;
        const kvr_flag *f = !keys ? flag_for(kk, l->route_flags, l->nroute_flags)
                            : i < n ? kvr_flags_find(l->flags, l->nflags, flags[i])
                                    : NULL;
        if (!keys && is(kk, "pd"))
            pd_walk(l, kk, v, pd_default, target);
        else if (f && !keys)
            apply_route_key(l, f, target, kk, v);
        else if (f)
            apply(l, f, target, kk, v);
        else if (keys)
            unknown(l, kk, keys, n, NULL, 0);
        else
            unknown(l, kk, NULL, 0, l->route_flags, l->nroute_flags);
    }
}

/* Workers and targets have the same shape: a plain scalar (the value of the first key), or a
 * mapping of the required key, a name, a weight, and the keys only one of them has (handled by
 * `more`, which returns 0 for a key it does not know). */
typedef struct shape {
    const char *keys[12]; /* every key, for the did-you-mean */
    size_t nkeys;
    const char *what;  /* singular, for "missing" */
    const char *plain; /* what a plain scalar item is */
    int (*more)(loader *l, const yaml_node_t *k, const yaml_node_t *v, void *ctx);
} shape;

/* The string value of `k` into *out; both key forms of a worker's upstream key given is
 * refused here rather than one silently winning over the other. */
static void key_source(loader *l, const yaml_node_t *k, const yaml_node_t *v, const char **out,
                       const char *other)
{
    const char *s = scalar(l, k, v, 1);
    if (s && other)
        fail(l, k, "%s: give api_key_file or api_key_env, not both", text(k));
    else if (s)
        *out = keep(l, s);
}

static const char *const KV_EVENTS_KEYS[] = {"endpoint", "replay_endpoint", "topic",
                                             "rank_port_offset"};

/* kv_events: {endpoint, replay_endpoint, topic} (vLLM's KVEventsConfig names), and
 * rank_port_offset (a data-parallel engine publishing rank r on port + r, as vLLM does). */
static void kv_events(loader *l, const yaml_node_t *k, const yaml_node_t *v, kvr_worker_spec *ws)
{
    if (!want(l, k, v, YAML_MAPPING_NODE))
        return;
    const char **dst[] = {&ws->kv_endpoint, &ws->kv_replay_endpoint, &ws->kv_topic};
    yaml_node_t *kk, *vv;
    EACH_PAIR(v, p) {
        if (!pair(l, v, p, &kk, &vv))
            continue;
        size_t i = 0;
        while (i < COUNT(KV_EVENTS_KEYS) && !is(kk, KV_EVENTS_KEYS[i]))
            i++;
        const char *s;
        if (i == COUNT(KV_EVENTS_KEYS))
            unknown(l, kk, KV_EVENTS_KEYS, COUNT(KV_EVENTS_KEYS), NULL, 0);
        else if (i == 3)
            apply(l, &KV_RANK_PORT_OFFSET, ws, kk, vv);
        else if ((s = scalar(l, kk, vv, i != 2)))
            *dst[i] = keep(l, s);
    }
    if (!ws->kv_endpoint)
        fail(l, k, "kv_events: missing 'endpoint'");
}

static const char *const LMCACHE_KEYS[] = {"endpoint"};

/* lmcache: {endpoint}: the full URL kvroute GETs for the worker's LMCache status. */
static void lmcache(loader *l, const yaml_node_t *k, const yaml_node_t *v, kvr_worker_spec *ws)
{
    if (!want(l, k, v, YAML_MAPPING_NODE))
        return;
    yaml_node_t *kk, *vv;
    EACH_PAIR(v, p) {
        if (!pair(l, v, p, &kk, &vv))
            continue;
        const char *s;
        if (!is(kk, LMCACHE_KEYS[0]))
            unknown(l, kk, LMCACHE_KEYS, COUNT(LMCACHE_KEYS), NULL, 0);
        else if ((s = scalar(l, kk, vv, 1)))
            ws->lmcache_endpoint = keep(l, s);
    }
    if (!ws->lmcache_endpoint)
        fail(l, k, "lmcache: missing 'endpoint'");
}

static int worker_key(loader *l, const yaml_node_t *k, const yaml_node_t *v, void *ctx)
{
    kvr_worker_spec *ws = ctx;
    if (is(k, "kv_events"))
        kv_events(l, k, v, ws);
    else if (is(k, "lmcache"))
        lmcache(l, k, v, ws);
    else if (is(k, "api_key_file"))
        key_source(l, k, v, &ws->api_key_file, ws->api_key_env);
    else if (is(k, "api_key_env"))
        key_source(l, k, v, &ws->api_key_env, ws->api_key_file);
    else if (is(k, "max_inflight"))
        apply(l, &WORKER_MAX_INFLIGHT, ws, k, v);
    else if (is(k, "data_parallel_size"))
        apply(l, &WORKER_DP_SIZE, ws, k, v);
    else if (is(k, "bootstrap_port"))
        apply(l, &WORKER_BOOTSTRAP_PORT, ws, k, v);
    else if (is(k, "role")) {
        const char *s = scalar(l, k, v, 1);
        if (s && kvr_worker_role_parse(s, &ws->role) < 0)
            fail(l, v, "role: '%s' (one of prefill, decode, both)", s);
    } else
        return 0;
    return 1;
}

static const shape WORKER = {{"url", "name", "weight", "api_key_file", "api_key_env",
                              "max_inflight", "kv_events", "lmcache", "data_parallel_size",
                              "role", "bootstrap_port"},
                             11, "worker", "a URL", worker_key};
static const shape TARGET = {{"worker", "model", "weight"}, 3, "target", "a worker name", NULL};

/* One item `it` of list `k`. 0 when it has no usable first key (then it is not kept). `ctx`
 * is given to the shape's `more`. */
static int entry(loader *l, const shape *sh, const yaml_node_t *k, const yaml_node_t *it,
                 const char **first, const char **second, double *w, void *ctx)
{
    const char *s;
    if (it->type == YAML_SCALAR_NODE) {
        if ((s = scalar(l, k, it, 1)))
            *first = keep(l, s);
        return s != NULL;
    }
    if (it->type != YAML_MAPPING_NODE) {
        fail(l, it, "%s: expected %s or a mapping", text(k), sh->plain);
        return 0;
    }
    yaml_node_t *kk, *v;
    int bad = 0;
    EACH_PAIR(it, p) {
        if (!pair(l, it, p, &kk, &v))
            continue;
        if (is(kk, sh->keys[0])) {
            bad = !(s = scalar(l, kk, v, 1));
            if (s)
                *first = keep(l, s);
        } else if (is(kk, sh->keys[1])) {
            if ((s = scalar(l, kk, v, 1)))
                *second = keep(l, s);
        } else if (is(kk, sh->keys[2])) {
            weight(l, kk, v, w);
        } else if (!sh->more || !sh->more(l, kk, v, ctx)) {
            unknown(l, kk, sh->keys, sh->nkeys, NULL, 0);
        }
    }
    if (!*first && !bad)
        fail(l, it, "%s: missing '%s'", sh->what, sh->keys[0]);
    return *first != NULL;
}

/* How many items of list `seq` to read: a worker list (the file's, or a route's targets) is
 * capped like --worker, which also stops aliased lists from multiplying. */
static size_t capped(loader *l, const yaml_node_t *k, const yaml_node_t *seq)
{
    if (!want(l, k, seq, YAML_SEQUENCE_NODE))
        return 0;
    if (nitems(seq) <= KVR_MAX_WORKERS)
        return nitems(seq);
    const yaml_node_t *it = ITEM(l, seq, KVR_MAX_WORKERS);
    fail(l, it ? it : seq, "%s: too many (max %d)", text(k), KVR_MAX_WORKERS);
    return KVR_MAX_WORKERS;
}

static void workers(loader *l, const yaml_node_t *k, const yaml_node_t *seq)
{
    kvr_config *c = l->c;
    size_t n = capped(l, k, seq);
    if (!n)
        return;
    /* The arena cannot grow an allocation: copy what is there into a larger one. */
    kvr_worker_spec *w = kvr_config_alloc(c, (c->nworkers + n) * sizeof(*w));
    if (c->nworkers)
        memcpy(w, c->workers, c->nworkers * sizeof(*w));
    c->workers = w;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *it = ITEM(l, seq, i);
        if (!it)
            continue;
        kvr_worker_spec ws = {.weight = 1, .line = LINE(it), .col = COL(it)};
        if (entry(l, &WORKER, k, it, &ws.url, &ws.name, &ws.weight, &ws)) {
            ws.name = ws.name ? ws.name : ws.url;
            c->workers[c->nworkers++] = ws;
        }
    }
}

static void targets(loader *l, const yaml_node_t *k, const yaml_node_t *seq, kvr_route_spec *r)
{
    size_t n = capped(l, k, seq);
    if (!n)
        return;
    r->targets = kvr_config_alloc(l->c, n * sizeof(*r->targets));
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *it = ITEM(l, seq, i);
        if (!it)
            continue;
        kvr_target_spec t = {.line = LINE(it), .col = COL(it)};
        if (entry(l, &TARGET, k, it, &t.worker, &t.model, &t.weight, NULL))
            r->targets[r->ntargets++] = t;
    }
}

/* A list of non-empty scalars, or one scalar as a list of one (`expect` says what the value
 * should have been), into a fresh arena array: *out and *n replace what was there. */
static void strings(loader *l, const yaml_node_t *k, const yaml_node_t *v, const char *expect,
                    const char ***out, size_t *n)
{
    const char *s;
    if (v->type == YAML_SCALAR_NODE) {
        if ((s = scalar(l, k, v, 1))) {
            *out = kvr_config_alloc(l->c, sizeof(**out));
            (*out)[0] = keep(l, s);
            *n = 1;
        }
        return;
    }
    if (v->type != YAML_SEQUENCE_NODE) {
        fail(l, v, "%s: expected %s", text(k), expect);
        return;
    }
    *out = NULL;
    *n = 0;
    if (!nitems(v))
        return;
    *out = kvr_config_alloc(l->c, nitems(v) * sizeof(**out));
    for (size_t i = 0; i < nitems(v); i++) {
        const yaml_node_t *it = ITEM(l, v, i);
        if (it && (s = scalar(l, k, it, 1)))
            (*out)[(*n)++] = keep(l, s);
    }
}

static void aliases(loader *l, const yaml_node_t *k, const yaml_node_t *v, kvr_route_spec *r)
{
    strings(l, k, v, "a name or a list of names", &r->aliases, &r->naliases);
}

/* A route's `pd: {mode, prefill_policy, decode_policy}`: kept as the route settings pd_mode,
 * pd_prefill_policy and pd_decode_policy (checked with the others once the flags are read). */
static void pd_setting(loader *l, size_t i, const yaml_node_t *kk, const yaml_node_t *v,
                       void *ctx)
{
    kvr_route_spec *r = ctx;
    const char *s = scalar(l, kk, v, 1);
    if (!s)
        return;
    char key[32];
    snprintf(key, sizeof(key), "%s", PD_FLAGS[i]);
    for (char *c = key; *c; c++)
        *c = *c == '-' ? '_' : *c;
    r->settings[r->nsettings++] = (kvr_setting){
        .key = keep(l, key), .value = keep(l, s), .line = LINE(v), .col = COL(v)};
}

/* One item of `routes`. 0 when it has no usable name (then it is not kept). */
static int route(loader *l, const yaml_node_t *k, const yaml_node_t *m, kvr_route_spec *r)
{
    *r = (kvr_route_spec){.line = LINE(m), .col = COL(m)};
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return 0;
    size_t npairs = (size_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    if (npairs)
        r->settings = kvr_config_alloc(l->c, (npairs + COUNT(PD_KEYS)) * sizeof(*r->settings));
    yaml_node_t *kk, *v;
    const yaml_node_t *named = NULL, *named_key = NULL; /* the first of name/model */
    int bad_name = 0;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &kk, &v))
            continue;
        if (is(kk, "name") || is(kk, "model")) {
            const char *s = scalar(l, kk, v, 1);
            if (s && named && strcmp(s, text(named))) {
                fail(l, v, "%s: '%s' differs from %s '%s' (give one of them)", text(kk), s,
                     text(named_key), text(named));
                s = NULL;
            }
            bad_name |= !s;
            if (s && !named)
                named = v, named_key = kk;
        } else if (is(kk, "aliases")) {
            aliases(l, kk, v, r);
        } else if (is(kk, "targets")) {
            targets(l, kk, v, r);
        } else if (is(kk, "service")) {
            const char *s = scalar(l, kk, v, 1);
            if (s)
                r->k8s_service = keep(l, s);
        } else if (is(kk, "pd")) {
            pd_walk(l, kk, v, pd_setting, r);
        } else {
            const kvr_flag *f = flag_for(kk, l->route_flags, l->nroute_flags);
            if (!f) {
                unknown(l, kk, ROUTE_KEYS, COUNT(ROUTE_KEYS), l->route_flags, l->nroute_flags);
                continue;
            }
            /* Checked now, at the value's position; applied over the defaults later. */
            kvr_route_cfg scratch = l->c->route;
            const char *s = apply_route_key(l, f, &scratch, kk, v);
            if (s)
                r->settings[r->nsettings++] = (kvr_setting){
                    .key = keep(l, text(kk)), .value = s, .line = LINE(v), .col = COL(v)};
        }
    }
    if (named && !bad_name)
        r->name = keep(l, text(named));
    else if (!named && !bad_name)
        fail(l, m, "route: missing 'name' (or 'model')");
    return r->name != NULL;
}

static void routes(loader *l, const yaml_node_t *k, const yaml_node_t *seq)
{
    if (!want(l, k, seq, YAML_SEQUENCE_NODE) || !nitems(seq))
        return;
    kvr_config *c = l->c;
    kvr_route_spec *rs = kvr_config_alloc(c, (c->nroutes + nitems(seq)) * sizeof(*rs));
    if (c->nroutes)
        memcpy(rs, c->routes, c->nroutes * sizeof(*rs));
    c->routes = rs;
    for (size_t i = 0; i < nitems(seq); i++) {
        const yaml_node_t *it = ITEM(l, seq, i);
        kvr_route_spec r;
        if (it && route(l, k, it, &r))
            c->routes[c->nroutes++] = r;
    }
}

/* `egress` {allow, deny}: kept as written; the entries' syntax is the egress module's to
 * check, against the section's position kept here. */
static void egress(loader *l, const yaml_node_t *k, const yaml_node_t *m)
{
    kvr_config *c = l->c;
    c->egress_line = LINE(k);
    c->egress_col = COL(k);
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return;
    static const char expect[] = "a CIDR, IP or host glob, or a list of them";
    yaml_node_t *kk, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &kk, &v))
            continue;
        if (is(kk, "allow"))
            strings(l, kk, v, expect, &c->egress_allow, &c->negress_allow);
        else if (is(kk, "deny"))
            strings(l, kk, v, expect, &c->egress_deny, &c->negress_deny);
        else
            unknown(l, kk, EGRESS_KEYS, COUNT(EGRESS_KEYS), NULL, 0);
    }
}

/* `rate_limits` {NAME: {requests_per_minute, tokens_per_minute}}. Duplicate names are the
 * mapping's duplicate keys (pair()). A limit whose NAME or value is unusable is not kept. */
static void rate_limits(loader *l, const yaml_node_t *k, const yaml_node_t *m)
{
    kvr_config *c = l->c;
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return;
    size_t npairs = (size_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    c->rate_limits = NULL;
    c->nrate_limits = 0;
    if (!npairs)
        return;
    c->rate_limits = kvr_config_alloc(c, npairs * sizeof(*c->rate_limits));
    yaml_node_t *name, *lim, *kk, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &name, &lim))
            continue;
        /* The name is matched against the key file's NAME: prefixes, which are never empty. */
        if (is_null(name) || !name->data.scalar.length ||
            memchr(name->data.scalar.value, '\0', name->data.scalar.length)) {
            fail(l, name, "%s: expected a key name", text(k));
            continue;
        }
        kvr_rate_limit_spec rl = {.line = LINE(name), .col = COL(name)};
        if (!want(l, name, lim, YAML_MAPPING_NODE))
            continue;
        EACH_PAIR(lim, q) {
            if (!pair(l, lim, q, &kk, &v))
                continue;
            const kvr_flag *f = flag_for(kk, LIMIT_FLAGS, COUNT(LIMIT_FLAGS));
            if (f)
                apply(l, f, &rl, kk, v);
            else
                unknown(l, kk, NULL, 0, LIMIT_FLAGS, COUNT(LIMIT_FLAGS));
        }
        rl.key = keep(l, text(name));
        c->rate_limits[c->nrate_limits++] = rl;
    }
}

static void global(loader *l, const yaml_node_t *k, const yaml_node_t *v)
{
    const kvr_flag *f = flag_for(k, l->flags, l->nflags);
    const kvr_flag *rf = flag_for(k, l->route_flags, l->nroute_flags);
    if (!f && rf && !strcmp(rf->name, "scorers"))
        /* The route defaults' `scorers`, as every other per-route key is a top-level one. */
        apply_scorers(l, rf, &l->c->route, k, v);
    else if (!f)
        unknown(l, k, TOP_KEYS, COUNT(TOP_KEYS), l->flags, l->nflags);
    else if (!strcmp(f->name, "worker"))
        fail(l, k, "worker: only on the command line (use `workers:` in a file)");
    else if (!strcmp(f->name, "api-key-file"))
        /* Said plainly: a worker's `api_key_file` (its own upstream key) is another thing, and
         * a top-level one read as either would be a silent surprise. */
        fail(l, k, "api_key_file: not a top-level key (client keys: use auth.api_keys_file)");
    else if (argv_only(f->name))
        fail(l, k, "%s: only on the command line", text(k));
    else
        apply(l, f, l->c, k, v);
}

/* `discovery: {kubernetes: {service, namespace, port, kv_events_port, kv_replay_port,
 * kv_topic}}` (the other settings of Kubernetes
 * discovery are flags, top-level keys here). */
static void discovery(loader *l, const yaml_node_t *k, const yaml_node_t *m)
{
    if (!want(l, k, m, YAML_MAPPING_NODE))
        return;
    yaml_node_t *kk, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &kk, &v))
            continue;
        if (is(kk, "kubernetes"))
            settings(l, kk, v, l->c, K8S_KEYS, K8S_FLAGS, COUNT(K8S_KEYS));
        else
            unknown(l, kk, DISCOVERY_KEYS, COUNT(DISCOVERY_KEYS), NULL, 0);
    }
}

static void top(loader *l, const yaml_node_t *m)
{
    if (m->type != YAML_MAPPING_NODE) {
        fail(l, m, "expected a mapping at the top level");
        return;
    }
    yaml_node_t *k, *v;
    EACH_PAIR(m, p) {
        if (!pair(l, m, p, &k, &v))
            continue;
        if (is(k, "listen"))
            settings(l, k, v, l->c, LISTEN_KEYS, LISTEN_FLAGS, COUNT(LISTEN_KEYS));
        else if (is(k, "admin"))
            settings(l, k, v, l->c, ADMIN_KEYS, ADMIN_FLAGS, COUNT(ADMIN_KEYS));
        else if (is(k, "auth"))
            settings(l, k, v, l->c, AUTH_KEYS, AUTH_FLAGS, COUNT(AUTH_KEYS));
        else if (is(k, "redis")) {
            settings(l, k, v, l->c, REDIS_KEYS, REDIS_FLAGS, COUNT(REDIS_KEYS));
            if (v->type == YAML_MAPPING_NODE &&
                v->data.mapping.pairs.top == v->data.mapping.pairs.start)
                fail(l, v, "redis: empty: give its url (redis://HOST[:PORT][/DB]), or drop it");
        }
        else if (is(k, "egress"))
            egress(l, k, v);
        else if (is(k, "discovery"))
            discovery(l, k, v);
        else if (is(k, "rate_limits"))
            rate_limits(l, k, v);
        else if (is(k, "defaults"))
            settings(l, k, v, &l->c->route, NULL, NULL, 0);
        else if (is(k, "workers"))
            workers(l, k, v);
        else if (is(k, "routes"))
            routes(l, k, v);
        else
            global(l, k, v);
    }
}

/* The whole file, NUL-terminated; NULL with errno set. */
static char *read_all(const char *path, size_t *len)
{
    /* A FIFO or a device would block the loop (reloads run on it): regular files only. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1), *nb;
    int err = buf ? 0 : ENOMEM;
    while (!err) {
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) {
                err = EFBIG;
                break;
            }
            if (!(nb = realloc(buf, 2 * cap + 1))) {
                err = ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        errno = 0;
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (!got && ferror(f))
            err = errno ? errno : EIO;
        else if (!got)
            break;
    }
    fclose(f);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Flow collections nested deeper than any config needs: libyaml's loader takes time quadratic
 * in the depth (100,000 levels: over a minute), and reloads run on the event loop. Returns
 * the 1-based line and column of the first bracket past the limit, or 0. */
#define MAX_FLOW_DEPTH 64
static int too_deep(const char *buf, size_t len, size_t *line, size_t *col)
{
    size_t depth = 0, ln = 1, bol = 0;
    char quote = 0;
    int comment = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        if (ch == '\n') {
            ln++;
            bol = i + 1;
            comment = 0;
            if (quote == '\'')
                continue;
        }
        if (comment)
            continue;
        if (quote) {
            if (quote == '"' && ch == '\\')
                i++;
            else if (ch == quote)
                quote = 0;
            continue;
        }
        if (ch == '"' || ch == '\'')
            quote = ch;
        else if (ch == '#' && (i == 0 || buf[i - 1] == ' ' || buf[i - 1] == '\t' ||
                               buf[i - 1] == '\n'))
            comment = 1;
        else if (ch == '[' || ch == '{') {
            if (++depth > MAX_FLOW_DEPTH) {
                *line = ln;
                *col = i - bol + 1;
                return 1;
            }
        } else if ((ch == ']' || ch == '}') && depth) {
            depth--;
        }
    }
    return 0;
}

static void syntax_error(loader *l, const yaml_parser_t *p, const char *buf, size_t len)
{
    if (p->error == YAML_MEMORY_ERROR) {
        kvr_errlist_add(l->errs, "%s:0:0: out of memory", l->path);
        return;
    }
    size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
    if (p->error == YAML_READER_ERROR) {
        /* The reader (encoding) errors only give a byte offset. */
        size_t off = p->problem_offset < len ? p->problem_offset : len, bol = 0;
        line = 1;
        for (size_t i = 0; i < off; i++)
            if (buf[i] == '\n')
                line++, bol = i + 1;
        col = off - bol + 1;
    }
    const char *problem = p->problem ? p->problem : "syntax error";
    if (p->context)
        kvr_errlist_add(l->errs, "%s:%zu:%zu: %s (%s at line %zu, column %zu)", l->path, line, col,
                        problem, p->context, p->context_mark.line + 1,
                        p->context_mark.column + 1);
    else
        kvr_errlist_add(l->errs, "%s:%zu:%zu: %s", l->path, line, col, problem);
}

int kvr_config_file_load(kvr_config *c, const char *path, kvr_errlist *errs)
{
    size_t before = errs->n, len = 0;
    char *buf = read_all(path, &len);
    if (!buf) {
        kvr_errlist_add(errs, "%s:0:0: cannot read: %s", path, strerror(errno));
        return -1;
    }
    size_t dl, dc;
    if (too_deep(buf, len, &dl, &dc)) {
        kvr_errlist_add(errs, "%s:%zu:%zu: nested deeper than %d levels", path, dl, dc,
                        MAX_FLOW_DEPTH);
        free(buf);
        return -1;
    }
    loader l = {.c = c, .path = path, .errs = errs};
    l.flags = kvr_config_flags(&l.nflags);
    l.route_flags = kvr_config_route_flags(&l.nroute_flags);
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        free(buf);
        kvr_errlist_add(errs, "%s:0:0: out of memory", path);
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    yaml_document_t doc;
    l.doc = &doc;
    if (!yaml_parser_load(&p, &doc)) {
        syntax_error(&l, &p, buf, len);
    } else {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        if (root && !is_null(root))
            top(&l, root);
        yaml_document_delete(&doc);
        /* A second document would be ignored silently by the loader: say so instead. */
        if (!yaml_parser_load(&p, &doc)) {
            syntax_error(&l, &p, buf, len);
        } else {
            if ((root = yaml_document_get_root_node(&doc)))
                fail(&l, root, "only one YAML document is allowed");
            yaml_document_delete(&doc);
        }
    }
    yaml_parser_delete(&p);
    free(buf);
    return errs->n > before ? -1 : 0;
}
