/* Load sharing (cluster/cluster.h): one script per --redis-load-interval-ms publishes this
 * replica's in-flight counts per worker name and returns the other fresh replicas'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/internal.h"
#include "util/log.h"
#include "util/time.h"

/* Most workers published (the config's KVR_MAX_WORKERS, and workers added at run time). */
#define MAX_LOAD_WORKERS 1024
/* Most other replicas read back per poll. */
#define MAX_REPLICAS 256

/* ARGV: replicas zset, load key prefix, me, now (wall ms), ttl ms, my log position, my
 * process nonce, then worker name / in-flight pairs. The hash {prefix}load:{me} holds `@pos`,
 * `@inst` and `w:NAME` fields; it expires after the TTL (three intervals), and so does the
 * replica's zset entry. Returns the `@inst` the entry held before this write ("" if none),
 * then {replica, age_ms, {field, value, ...}} triples of the other fresh replicas. */
static const char LOAD_SCRIPT[] =
    "local z, lp, me = ARGV[1], ARGV[2], ARGV[3]\n"
    "local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local lk = lp .. me\n"
    "local prev = redis.call('HGET', lk, '@inst') or ''\n"
    "redis.call('DEL', lk)\n"
    "redis.call('HSET', lk, '@pos', ARGV[6], '@inst', ARGV[7])\n"
    "for i = 8, #ARGV - 1, 2 do redis.call('HSET', lk, 'w:' .. ARGV[i], ARGV[i + 1]) end\n"
    "redis.call('PEXPIRE', lk, ttl)\n"
    "redis.call('ZADD', z, now, me)\n"
    "redis.call('ZREMRANGEBYSCORE', z, '-inf', '(' .. (now - ttl))\n"
    "local out = {prev}\n"
    "local rs = redis.call('ZRANGE', z, 0, -1, 'WITHSCORES')\n"
    "for i = 1, #rs, 2 do\n"
    "  if rs[i] ~= me then\n"
    "    local h = redis.call('HGETALL', lp .. rs[i])\n"
    "    if #h > 0 then\n"
    "      out[#out + 1] = rs[i]\n"
    "      out[#out + 1] = tostring(math.max(0, now - tonumber(rs[i + 1])))\n"
    "      out[#out + 1] = h\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return out\n";

/* Sums per worker name (a small linear table: fleets are tens of workers). */
typedef struct sum_tab {
    kvr_cluster_load *v;
    size_t n;
} sum_tab;

static void add_load(sum_tab *t, const char *w, size_t len, int64_t n)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].worker_len == len && !memcmp(t->v[i].worker, w, len)) {
            t->v[i].inflight += n;
            return;
        }
    if (t->n >= MAX_LOAD_WORKERS)
        return;
    t->v[t->n++] = (kvr_cluster_load){.worker = w, .worker_len = len, .inflight = n};
}

static void set_replicas(kvr_cluster *c, size_t n)
{
    c->replicas = n;
    kvr_metric_set(c->m_replicas, NULL, (double)n);
}

/* Once this process's entry has been written, only another live process with the same
 * --replica-id writes a different nonce into it: the two would skip each other's routing-log
 * entries as their own. A predecessor's nonce found by the first write is a restart. */
static void note_previous_writer(kvr_cluster *c, const redisReply *prev)
{
    size_t il = strlen(c->inst);
    int other = prev->len && (prev->len != il || memcmp(prev->str, c->inst, il));
    uint64_t now = kvr_now_ms();
    if (c->load_written && other) {
        if (!c->id_conflict)
            KVR_ERROR("msg=\"another live kvroute publishes under this --replica-id: give "
                      "each replica its own, or they skip each other's routing-log entries\" "
                      "replica_id=%s",
                      c->replica);
        c->id_conflict = 1;
        c->conflict_ms = now;
    } else if (c->id_conflict && now - c->conflict_ms > 10 * c->cfg.load_interval_ms) {
        /* the other writes at its own pace: only a long quiet ends the conflict */
        c->id_conflict = 0;
        KVR_INFO("msg=\"--replica-id conflict over\" replica_id=%s", c->replica);
    }
    kvr_metric_set(c->m_conflict, NULL, c->id_conflict);
    c->load_written = 1;
}

static void on_load(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster *c = priv;
    if (!kvr_conn_settle(&c->cmd, ac) || !r)
        return;
    c->load_pending = 0;
    redisReply *rep = r;
    if (rep->type != REDIS_REPLY_ARRAY) {
        kvr_cluster_error(c, "load");
        if (rep->type == REDIS_REPLY_ERROR)
            KVR_WARN("msg=\"redis load script failed\" error=\"%.200s\"", rep->str);
        return;
    }
    c->load_ok_ms = kvr_now_ms();
    if (!rep->elements || rep->element[0]->type != REDIS_REPLY_STRING) {
        kvr_cluster_error(c, "load");
        return;
    }
    note_previous_writer(c, rep->element[0]);
    size_t nrep = (rep->elements - 1) / 3;
    if (nrep > MAX_REPLICAS)
        nrep = MAX_REPLICAS;
    kvr_replica_seen *seen = nrep ? calloc(nrep, sizeof(*seen)) : NULL;
    kvr_cluster_load *v = calloc(MAX_LOAD_WORKERS, sizeof(*v));
    if ((nrep && !seen) || !v) {
        free(seen);
        free(v);
        return;
    }
    sum_tab t = {.v = v};
    size_t ns = 0;
    for (size_t i = 0; i < nrep; i++) {
        const redisReply *id = rep->element[1 + 3 * i], *age = rep->element[2 + 3 * i],
                         *h = rep->element[3 + 3 * i];
        if (id->type != REDIS_REPLY_STRING || age->type != REDIS_REPLY_STRING ||
            h->type != REDIS_REPLY_ARRAY || id->len > KVR_ENTRY_MAX_NAME)
            continue;
        kvr_replica_seen *s = &seen[ns++];
        memcpy(s->id, id->str, id->len);
        s->age_ms = strtoull(age->str, NULL, 10);
        for (size_t j = 0; j + 1 < h->elements; j += 2) {
            const redisReply *f = h->element[j], *val = h->element[j + 1];
            if (f->type != REDIS_REPLY_STRING || val->type != REDIS_REPLY_STRING)
                continue;
            if (f->len == 4 && !memcmp(f->str, "@pos", 4)) {
                snprintf(s->pos, sizeof(s->pos), "%.*s", (int)(val->len < 47 ? val->len : 47),
                         val->str);
            } else if (f->len > 2 && !memcmp(f->str, "w:", 2)) {
                char num[24];
                snprintf(num, sizeof(num), "%.*s", (int)(val->len < 23 ? val->len : 23),
                         val->str);
                long long n = strtoll(num, NULL, 10);
                if (n > 0 && n < (1LL << 40))
                    add_load(&t, f->str + 2, f->len - 2, n);
            }
        }
    }
    if (c->hooks.remote_load)
        c->hooks.remote_load(c->hooks.ud, t.v, t.n);
    free(v);
    free(c->seen);
    c->seen = seen;
    c->nseen = ns;
    set_replicas(c, ns + 1);
}

void kvr_load_tick(uv_timer_t *t)
{
    kvr_cluster *c = t->data;
    uint64_t now = kvr_now_ms();
    /* Nothing fresh for three intervals: the others' counts are stale, stop adding them. */
    if (c->load_ok_ms && now - c->load_ok_ms > 3 * c->cfg.load_interval_ms) {
        if (c->hooks.remote_load)
            c->hooks.remote_load(c->hooks.ud, NULL, 0);
        c->load_ok_ms = 0;
    }
    if (!kvr_cluster_up(c) || c->load_pending || !c->hooks.local_load)
        return;
    static const char *names[MAX_LOAD_WORKERS];
    static int64_t counts[MAX_LOAD_WORKERS];
    size_t n = c->hooks.local_load(c->hooks.ud, names, counts, MAX_LOAD_WORKERS);
    size_t argc = 10 + 2 * n;
    const char **argv = malloc(argc * sizeof(*argv));
    size_t *lens = malloc(argc * sizeof(*lens));
    char *nums = malloc((n + 1) * 24);
    char fixed[3][24];
    if (!argv || !lens || !nums) {
        free(argv);
        free(lens);
        free(nums);
        return;
    }
    int l0 = snprintf(fixed[0], 24, "%llu", (unsigned long long)kvr_cluster_wall_ms());
    int l1 = snprintf(fixed[1], 24, "%llu", (unsigned long long)(3 * c->cfg.load_interval_ms));
    argv[0] = "EVAL";
    lens[0] = 4;
    argv[1] = LOAD_SCRIPT;
    lens[1] = sizeof(LOAD_SCRIPT) - 1;
    argv[2] = "0";
    lens[2] = 1;
    argv[3] = c->key_replicas;
    lens[3] = strlen(c->key_replicas);
    argv[4] = c->key_load;
    lens[4] = strlen(c->key_load);
    argv[5] = c->replica;
    lens[5] = strlen(c->replica);
    argv[6] = fixed[0];
    lens[6] = (size_t)l0;
    argv[7] = fixed[1];
    lens[7] = (size_t)l1;
    argv[8] = c->last_id;
    lens[8] = strlen(c->last_id);
    argv[9] = c->inst;
    lens[9] = strlen(c->inst);
    for (size_t i = 0; i < n; i++) {
        char *num = nums + i * 24;
        int l = snprintf(num, 24, "%lld", (long long)counts[i]);
        argv[10 + 2 * i] = names[i];
        lens[10 + 2 * i] = strlen(names[i]);
        argv[11 + 2 * i] = num;
        lens[11 + 2 * i] = (size_t)l;
    }
    if (kvr_conn_send(&c->cmd, on_load, c, (int)argc, argv, lens) == 0)
        c->load_pending = 1;
    free(argv);
    free(lens);
    free(nums);
}

void kvr_load_free(kvr_cluster *c)
{
    free(c->seen);
    c->seen = NULL;
    c->nseen = 0;
}
