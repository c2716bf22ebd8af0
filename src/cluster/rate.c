/* Rate limits across replicas (cluster/cluster.h): one EVAL per request, answered within
 * --redis-timeout-ms or not at all (the caller then enforces its share locally). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/internal.h"
#include "util/log.h"

/* GCRA (the generic cell rate algorithm, as redis-cell and Stripe's limiter use it): a key's
 * theoretical arrival time `tat` advances by 60000 / limit ms per request; a request fits
 * while tat − now stays within one minute, so a key may spend its whole minute at once and
 * then one request every 60000 / limit ms. Time is the Redis server's (TIME), so replicas'
 * clocks do not matter. KEYS[1] = the key's counter; ARGV = limit per minute, cost.
 * Returns {allowed 1/0, ms until it would fit}. */
static const char RATE_SCRIPT[] =
    "local limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local step = 60000 / limit\n"
    "local tat = tonumber(redis.call('GET', KEYS[1]) or '0')\n"
    "if tat < now then tat = now end\n"
    "local new = tat + step * cost\n"
    "if new - now > 60000 then return {0, math.ceil(new - now - 60000)} end\n"
    "redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil(new - now) + 1000)\n"
    "return {1, 0}\n";

struct kvr_cluster_rate_op {
    kvr_cluster *c;
    kvr_cluster_rate_cb cb;
    void *ud;
    uv_timer_t timer;
    int done;       /* the answer was given (or cancelled) */
    int refs;       /* the reply callback (if sent) + the timer handle */
};

static void op_unref(kvr_cluster_rate_op *op)
{
    if (--op->refs == 0)
        free(op);
}

static void on_timer_closed(uv_handle_t *h)
{
    op_unref(h->data);
}

static void finish(kvr_cluster_rate_op *op, int allowed, uint64_t retry_ms)
{
    if (op->done)
        return;
    op->done = 1;
    uv_timer_stop(&op->timer);
    uv_close((uv_handle_t *)&op->timer, on_timer_closed);
    op->cb(op->ud, allowed, retry_ms);
}

static void on_timeout(uv_timer_t *t)
{
    kvr_cluster_rate_op *op = t->data;
    if (!op->done && kvr_cluster_up(op->c))
        kvr_cluster_error(op->c, "ratelimit_timeout");
    finish(op, -1, 0);
}

static void on_reply(redisAsyncContext *ac, void *r, void *priv)
{
    kvr_cluster_rate_op *op = priv;
    kvr_conn_settle(&op->c->cmd, ac);
    redisReply *rep = r;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_INTEGER) {
        long long retry = rep->element[1]->integer;
        finish(op, rep->element[0]->integer ? 1 : 0, retry > 0 ? (uint64_t)retry : 0);
    } else if (rep && !op->done) {
        kvr_cluster_error(op->c, "ratelimit");
        if (rep->type == REDIS_REPLY_ERROR)
            KVR_WARN("msg=\"redis rate-limit script failed\" error=\"%.200s\"", rep->str);
        finish(op, -1, 0);
    }
    op_unref(op);
}

kvr_cluster_rate_op *kvr_cluster_rate(kvr_cluster *c, const char *key, uint64_t limit,
                                      uint64_t cost, kvr_cluster_rate_cb cb, void *ud)
{
    kvr_cluster_rate_op *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    op->c = c;
    op->cb = cb;
    op->ud = ud;
    op->refs = 1;
    uv_timer_init(c->loop, &op->timer);
    op->timer.data = op;
    if (limit && kvr_cluster_up(c)) {
        char k[1024], lim[24], cst[24];
        int kl = snprintf(k, sizeof(k), "%srl:%s", c->cfg.key_prefix ? c->cfg.key_prefix : "",
                          key);
        int ll = snprintf(lim, sizeof(lim), "%llu", (unsigned long long)limit);
        int cl = snprintf(cst, sizeof(cst), "%llu", (unsigned long long)cost);
        if (kl > 0 && (size_t)kl < sizeof(k)) {
            const char *argv[] = {"EVAL", RATE_SCRIPT, "1", k, lim, cst};
            size_t lens[] = {4, sizeof(RATE_SCRIPT) - 1, 1, (size_t)kl, (size_t)ll, (size_t)cl};
            if (kvr_conn_send(&c->cmd, on_reply, op, 6, argv, lens) == 0) {
                op->refs++;
                uv_timer_start(&op->timer, on_timeout, c->cfg.timeout_ms, 0);
                return op;
            }
        }
    }
    /* Redis is away: answer "unknown" on the next loop turn (never from inside this call). */
    uv_timer_start(&op->timer, on_timeout, 0, 0);
    return op;
}

void kvr_cluster_rate_cancel(kvr_cluster_rate_op *op)
{
    if (!op || op->done)
        return;
    op->done = 1;
    uv_timer_stop(&op->timer);
    uv_close((uv_handle_t *)&op->timer, on_timer_closed);
}
