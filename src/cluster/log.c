/* The routing log: entries out (queued, flushed as pipelined XADDs) and in (XREAD from the
 * last id, the warm start included) (cluster/cluster.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/internal.h"
#include "util/log.h"
#include "util/time.h"

/* XREAD's BLOCK once caught up: how long one read may wait for a new entry (ms). The
 * connection's stall allowance grows by as much while it waits. */
#define READ_BLOCK_MS 1000

/* ---- out ---- */

void kvr_cluster_append(kvr_cluster *c, kvr_entry *e)
{
    e->replica = c->replica;
    e->replica_len = strlen(c->replica);
    if (!e->ts_ms)
        e->ts_ms = kvr_cluster_wall_ms();
    if (c->queued >= c->cfg.queue_max ||
        c->queue.len + 160 + e->nkeys * 8 > c->cfg.queue_max_bytes) {
        kvr_cluster_error(c, "queue");
        return;
    }
    if (kvr_entry_encode(e, c->cfg.entry_max_blocks, &c->queue) < 0) {
        kvr_cluster_error(c, "encode");
        return;
    }
    c->queued++;
    if (!c->flush_armed && !c->closing) {
        c->flush_armed = 1;
        uv_timer_start(&c->flush_timer, kvr_log_flush_cb, c->cfg.flush_ms, 0);
    }
}

static void on_xadd(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster *c = priv;
    if (!kvr_conn_settle(&c->cmd, ac) || !r)
        return;
    redisReply *rep = r;
    if (rep->type == REDIS_REPLY_ERROR) {
        kvr_cluster_error(c, "xadd");
        return;
    }
    c->out_total++;
    const char *lv[] = {"out"};
    kvr_metric_inc(c->m_entries, lv, 1);
}

static void flush(kvr_cluster *c)
{
    if (!kvr_cluster_up(c) || !c->queue.len)
        return;
    char maxlen[24];
    int ml = snprintf(maxlen, sizeof(maxlen), "%zu", c->cfg.log_max_len);
    const char *argv[6 + KVR_ENTRY_MAX_FIELDS] = {"XADD", c->key_log, "MAXLEN", "~", maxlen, "*"};
    size_t lens[6 + KVR_ENTRY_MAX_FIELDS] = {4, strlen(c->key_log), 6, 1, (size_t)ml, 1};
    size_t off = 0, done = 0;
    while (off < c->queue.len) {
        size_t at = off;
        size_t n = kvr_entry_frame_next(c->queue.data, c->queue.len, &off, argv + 6, lens + 6);
        if (!n) {
            off = c->queue.len; /* cannot happen: frames are written whole */
            break;
        }
        if (kvr_conn_send(&c->cmd, on_xadd, c, (int)(6 + n), argv, lens) < 0) {
            off = at;
            break;
        }
        done++;
    }
    kvr_buf_consume(&c->queue, off);
    c->queued -= done < c->queued ? done : c->queued;
    if (!c->queue.len)
        c->queued = 0;
}

void kvr_log_flush_cb(uv_timer_t *t)
{
    kvr_cluster *c = t->data;
    c->flush_armed = 0;
    flush(c);
}

/* ---- in ---- */

/* "MS-SEQ" into two numbers; -1 when malformed. */
static int parse_id(const char *s, size_t n, uint64_t *ms, uint64_t *seq)
{
    uint64_t a = 0, b = 0;
    size_t i = 0;
    if (!n)
        return -1;
    for (; i < n && s[i] != '-'; i++) {
        if (s[i] < '0' || s[i] > '9' || a > UINT64_MAX / 10 - 1)
            return -1;
        a = a * 10 + (uint64_t)(s[i] - '0');
    }
    if (i < n) {
        i++;
        if (i == n)
            return -1;
        for (; i < n; i++) {
            if (s[i] < '0' || s[i] > '9' || b > UINT64_MAX / 10 - 1)
                return -1;
            b = b * 10 + (uint64_t)(s[i] - '0');
        }
    }
    *ms = a;
    *seq = b;
    return 0;
}

static int id_cmp(const char *a, const char *b)
{
    uint64_t am = 0, as = 0, bm = 0, bs = 0;
    parse_id(a, strlen(a), &am, &as);
    parse_id(b, strlen(b), &bm, &bs);
    return am != bm ? (am < bm ? -1 : 1) : as != bs ? (as < bs ? -1 : 1) : 0;
}

static void warm_done(kvr_cluster *c, const char *why)
{
    if (c->warm)
        return;
    c->warm = 1;
    kvr_hold_release(c);
    KVR_INFO("msg=\"cluster warm start over\" why=%s applied=%zu last_id=%s ms=%llu", why,
             c->warm_applied, c->last_id, (unsigned long long)(kvr_now_ms() - c->start_ms));
}

void kvr_log_warm_deadline(kvr_cluster *c)
{
    warm_done(c, "timeout");
}

/* One stream entry [id, [field, value, ...]]. */
static void take_entry(kvr_cluster *c, const redisReply *ent, uint64_t now_wall)
{
    if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
        ent->element[0]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *id = ent->element[0], *fv = ent->element[1];
    if (id->len < sizeof(c->last_id)) {
        memcpy(c->last_id, id->str, id->len);
        c->last_id[id->len] = '\0';
    }
    if (c->warm_skip) {
        c->warm_skip--;
        return;
    }
    if (fv->type != REDIS_REPLY_ARRAY || fv->elements > 64)
        return;
    const char *f[64];
    size_t fl[64];
    for (size_t i = 0; i < fv->elements; i++) {
        if (fv->element[i]->type != REDIS_REPLY_STRING)
            return;
        f[i] = fv->element[i]->str;
        fl[i] = fv->element[i]->len;
    }
    kvr_entry e;
    int rc = kvr_entry_decode(f, fl, fv->elements, &e);
    if (rc < 0) {
        kvr_cluster_error(c, "decode");
        return;
    }
    if (rc > 0)
        return;
    /* This process's own entries were applied when it learned them; a previous process with
     * the same --replica-id wrote before this one started, and those are replayed. */
    size_t rl = strlen(c->replica);
    if (e.replica_len == rl && !memcmp(e.replica, c->replica, rl) && e.ts_ms >= c->start_wall_ms)
        return;
    uint64_t age = now_wall > e.ts_ms ? now_wall - e.ts_ms : 0;
    if (c->hooks.apply)
        c->hooks.apply(c->hooks.ud, &e, age);
    c->in_total++;
    if (!c->warm)
        c->warm_applied++;
    c->lag_s = (double)age / 1000.0;
    const char *lv[] = {"in"};
    kvr_metric_inc(c->m_entries, lv, 1);
    kvr_metric_set(c->m_lag, NULL, c->lag_s);
}

static void read_next(kvr_cluster *c);

static void on_xread(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster *c = priv;
    if (!kvr_conn_settle(&c->rd, ac) || !r)
        return;
    c->rd.allowance_ms = 0;
    redisReply *rep = r;
    size_t got = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        kvr_cluster_error(c, "xread");
        KVR_WARN("msg=\"redis XREAD failed\" error=\"%.200s\"", rep->str);
        kvr_cluster_fail(c, NULL);
        return;
    }
    if (rep->type == REDIS_REPLY_ARRAY) {
        uint64_t now = kvr_cluster_wall_ms();
        for (size_t s = 0; s < rep->elements; s++) {
            const redisReply *st = rep->element[s];
            if (st->type != REDIS_REPLY_ARRAY || st->elements != 2 ||
                st->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            const redisReply *ents = st->element[1];
            for (size_t i = 0; i < ents->elements; i++)
                take_entry(c, ents->element[i], now);
            got += ents->elements;
        }
    }
    if (c->warming && got < c->cfg.read_count) {
        c->warming = 0;
        warm_done(c, "replayed");
    }
    read_next(c);
}

/* The log's oldest entry, asked before every read: newer than the last id read means the
 * read that follows skips what was trimmed meanwhile (the gap is counted). */
static void on_first_check(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster *c = priv;
    if (!kvr_conn_settle(&c->rd, ac) || !r)
        return;
    redisReply *rep = r;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
        rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2 &&
        rep->element[0]->element[0]->type == REDIS_REPLY_STRING) {
        const redisReply *id = rep->element[0]->element[0];
        kvr_log_check_first(c, id->str, id->len);
    }
}

static void read_next(kvr_cluster *c)
{
    char count[24], block[24];
    if (strcmp(c->last_id, "0-0") != 0) {
        const char *argv[] = {"XRANGE", c->key_log, "-", "+", "COUNT", "1"};
        size_t lens[] = {6, strlen(c->key_log), 1, 1, 5, 1};
        kvr_conn_send(&c->rd, on_first_check, c, 6, argv, lens);
    }
    int cl = snprintf(count, sizeof(count), "%zu", c->cfg.read_count);
    int bl = snprintf(block, sizeof(block), "%d", READ_BLOCK_MS);
    if (c->warming) {
        /* Catching up: never wait, so an empty page says the end was reached. */
        const char *argv[] = {"XREAD", "COUNT", count, "STREAMS", c->key_log, c->last_id};
        size_t lens[] = {5, 5, (size_t)cl, 7, strlen(c->key_log), strlen(c->last_id)};
        kvr_conn_send(&c->rd, on_xread, c, 6, argv, lens);
        return;
    }
    const char *argv[] = {"XREAD", "COUNT", count, "BLOCK", block, "STREAMS", c->key_log,
                          c->last_id};
    size_t lens[] = {5, 5, (size_t)cl, 5, (size_t)bl, 7, strlen(c->key_log), strlen(c->last_id)};
    if (kvr_conn_send(&c->rd, on_xread, c, 8, argv, lens) == 0)
        c->rd.allowance_ms = READ_BLOCK_MS;
}

static void on_xlen(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster *c = priv;
    if (!kvr_conn_settle(&c->rd, ac) || !r)
        return;
    redisReply *rep = r;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer > 0 &&
        (unsigned long long)rep->integer > c->cfg.warm_max_entries)
        c->warm_skip = (size_t)rep->integer - c->cfg.warm_max_entries;
    read_next(c);
}

void kvr_log_check_first(kvr_cluster *c, const char *first, size_t len)
{
    char f[48];
    uint64_t a, b;
    if (!len || len >= sizeof(f) || !strcmp(c->last_id, "0-0"))
        return;
    memcpy(f, first, len);
    f[len] = '\0';
    if (parse_id(f, len, &a, &b) < 0 || id_cmp(f, c->last_id) <= 0 || !strcmp(f, c->gap_at))
        return;
    snprintf(c->gap_at, sizeof(c->gap_at), "%s", f);
    kvr_cluster_error(c, "log_gap");
    KVR_WARN("msg=\"routing log trimmed past this replica's position\" last_id=%s first_id=%s",
             c->last_id, f);
}


void kvr_log_on_up(kvr_cluster *c)
{
    if (!strcmp(c->last_id, "0-0")) {
        /* First read: the warm window is the newest --redis-warm-max-entries. */
        const char *argv[] = {"XLEN", c->key_log};
        size_t lens[] = {4, strlen(c->key_log)};
        kvr_conn_send(&c->rd, on_xlen, c, 2, argv, lens);
    } else {
        read_next(c); /* resumes from the last id (a gap checked first) */
    }
    flush(c);
}

void kvr_log_free(kvr_cluster *c)
{
    kvr_buf_free(&c->queue);
}
