/* KV-event ingest thread. See ingest.h for the protocol rules; this file is the state machine
 * of one worker's stream (connect → full replay → live, with repairs) and the plumbing that
 * hands decoded batches to the loop thread. */
#include "events/ingest.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "util/log.h"
#include "util/time.h"

#define POLL_MS 50           /* longest wait before commands and timers are looked at */
#define NO_SEQ UINT64_MAX    /* also vLLM's end-of-replay marker */
#define WARN_EVERY_MS 60000  /* fallback warnings per worker */

typedef enum { P_CONNECTING, P_REPLAYING, P_LIVE, P_FALLBACK } phase;

typedef struct pending {
    struct pending *next;
    uint64_t seq;
    kvr_kv_batch *batch;
    size_t bytes;                /* its payload's size, for the bound on buffered bytes */
} pending;

typedef struct sub {
    struct sub *next;
    size_t worker;
    uint64_t gen;
    char *ep, *rep, *topic;
    void *sock, *dealer, *mon;
    phase ph;
    kvr_kv_trust told;           /* last state sent to the loop */
    int told_partial;            /* ... and its partial flag */
    int connected;
    uint64_t since_ms;           /* phase entered / added */
    uint64_t last_seq;           /* last delivered, NO_SEQ = none */
    /* replay */
    int want_replay;             /* 1 repair from last+1, 2 full (clear, from 0) */
    int replaying;               /* a request is out */
    int full;                    /* the running replay started from 0 after a clear */
    int partial;                 /* ... and the worker's buffer started later */
    uint64_t from, expect;       /* asked-for seq, next expected reply seq */
    uint64_t started_ms, heard_ms;
    unsigned failures;
    uint64_t retry_at;
    pending *pend, *pend_tail;   /* live batches that arrived during a replay */
    size_t npend, pend_bytes;
    int partial_history;         /* the last full replay found the worker's buffer started
                                    later: blocks stored before it are unknown */
    int resync_after_overflow;
    uint64_t warned_ms;          /* last fallback warning */
    unsigned opens;              /* sockets opened so far (names the monitor endpoint) */
    kvr_kv_stream_stats st;      /* guarded by the ingest mutex */
} sub;

typedef enum { C_ADD, C_REMOVE, C_RESYNC } cmd_kind;
typedef struct cmd {
    struct cmd *next;
    cmd_kind kind;
    size_t worker;
    uint64_t gen;
    int clear;
    char *ep, *rep, *topic;
} cmd;

struct kvr_kv_ingest {
    kvr_kv_ingest_cfg cfg;
    void *zctx;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;          /* guards everything below plus every sub's `st` */
    int stop;
    cmd *cmds, *cmds_tail;
    kvr_kv_op *ops, *ops_tail;
    size_t nbatches;             /* BATCH ops waiting */
    uint64_t next_gen;
    sub *subs;                   /* written by the thread only, under mu */
    unsigned active_replays;     /* thread only */
    uv_async_t async;
    kvr_kv_ingest_notify notify;
    void *ud;
};

const char *kvr_kv_trust_name(kvr_kv_trust t)
{
    static const char *const n[] = {"exact", "degraded", "fallback"};
    return (unsigned)t < 3 ? n[t] : "?";
}

const char *kvr_kv_replay_result_name(kvr_kv_replay_result r)
{
    static const char *const n[] = {"ok", "partial", "timeout", "error"};
    return (unsigned)r < KVR_KV_REPLAY_NRESULTS ? n[r] : "?";
}

void kvr_kv_ingest_cfg_default(kvr_kv_ingest_cfg *c)
{
    *c = (kvr_kv_ingest_cfg){
        .queue_batches = 10000,
        .max_message_bytes = 64u << 20,
        .replay_idle_ms = 2000,
        .replay_max_ms = 30000,
        .max_concurrent_replays = 8,
        .replay_attempts = 3,
        .retry_ms = 5000,
        .connect_timeout_ms = 3000,
    };
}

void kvr_kv_op_free(kvr_kv_op *op)
{
    if (!op)
        return;
    kvr_kv_batch_free(op->batch);
    free(op);
}

/* ---- ops to the loop ---- */

/* BATCH ops respect the queue bound (returns -1 when full: the batch is dropped); control ops
 * always fit, and there are a handful per replay at most. */
static int push(kvr_kv_ingest *ing, sub *s, kvr_kv_op_kind kind, uint64_t seq,
                kvr_kv_batch *batch, kvr_kv_trust state)
{
    kvr_kv_op *op = calloc(1, sizeof(*op));
    pthread_mutex_lock(&ing->mu);
    int full = kind == KVR_KV_OP_BATCH && ing->nbatches >= ing->cfg.queue_batches;
    if (!op || full) {
        pthread_mutex_unlock(&ing->mu);
        free(op);
        kvr_kv_batch_free(batch);
        return -1;
    }
    *op = (kvr_kv_op){.kind = kind, .worker = s->worker, .gen = s->gen, .seq = seq,
                      .batch = batch, .state = state, .partial = s->partial_history};
    if (ing->ops_tail)
        ing->ops_tail->next = op;
    else
        ing->ops = op;
    ing->ops_tail = op;
    if (kind == KVR_KV_OP_BATCH)
        ing->nbatches++;
    pthread_mutex_unlock(&ing->mu);
    uv_async_send(&ing->async);
    return 0;
}

static void tell(kvr_kv_ingest *ing, sub *s, kvr_kv_trust t)
{
    if (s->told == t && s->told_partial == s->partial_history)
        return;
    if (push(ing, s, KVR_KV_OP_STATE, 0, NULL, t) == 0) {
        s->told = t;
        s->told_partial = s->partial_history;
        KVR_INFO("kv-events: worker %zu events %s (%s)", s->worker, kvr_kv_trust_name(t), s->ep);
    }
}

#define COUNT(ing, s, field)                                                                   \
    do {                                                                                       \
        pthread_mutex_lock(&(ing)->mu);                                                        \
        (s)->st.field++;                                                                       \
        pthread_mutex_unlock(&(ing)->mu);                                                      \
    } while (0)

static void set_last(kvr_kv_ingest *ing, sub *s, uint64_t seq)
{
    s->last_seq = seq;
    pthread_mutex_lock(&ing->mu);
    s->st.last_seq = seq;
    pthread_mutex_unlock(&ing->mu);
}

static void drop_pending(sub *s)
{
    while (s->pend) {
        pending *p = s->pend;
        s->pend = p->next;
        kvr_kv_batch_free(p->batch);
        free(p);
    }
    s->pend_tail = NULL;
    s->npend = 0;
    s->pend_bytes = 0;
}

/* ---- sockets ---- */

static void close_sock(void **p)
{
    if (*p)
        zmq_close(*p);
    *p = NULL;
}

static void *open_dealer(kvr_kv_ingest *ing, sub *s)
{
    void *d = zmq_socket(ing->zctx, ZMQ_DEALER);
    int zero = 0;
    int64_t max = (int64_t)ing->cfg.max_message_bytes;
    if (!d)
        return NULL;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    if (zmq_connect(d, s->rep) != 0) {
        KVR_WARN("kv-events: worker %zu: cannot connect replay %s: %s", s->worker, s->rep,
                 zmq_strerror(errno));
        zmq_close(d);
        return NULL;
    }
    return d;
}

static int open_sub(kvr_kv_ingest *ing, sub *s)
{
    char mon[96];
    int zero = 0, hwm = 1000000, ivl = 200, ivl_max = 2000;
    int64_t max = (int64_t)ing->cfg.max_message_bytes;
    s->sock = zmq_socket(ing->zctx, ZMQ_SUB);
    if (!s->sock)
        return -1;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    zmq_setsockopt(s->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
    zmq_setsockopt(s->sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
    zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic));
    /* The monitor tells whether anything listens at the endpoint (SUB sockets are silent). */
    snprintf(mon, sizeof(mon), "inproc://kvr-mon-%zu-%llu-%u", s->worker,
             (unsigned long long)s->gen, ++s->opens);
    if (zmq_socket_monitor(s->sock, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        s->mon = zmq_socket(ing->zctx, ZMQ_PAIR);
        if (s->mon && zmq_connect(s->mon, mon) != 0)
            close_sock(&s->mon);
    }
    if (zmq_connect(s->sock, s->ep) != 0) {
        KVR_WARN("kv-events: worker %zu: cannot connect %s: %s", s->worker, s->ep,
                 zmq_strerror(errno));
        return -1;
    }
    if (s->rep)
        s->dealer = open_dealer(ing, s);
    return 0;
}

static void close_sub(kvr_kv_ingest *ing, sub *s)
{
    if (s->replaying)
        ing->active_replays--;
    s->replaying = 0;
    close_sock(&s->dealer);
    if (s->sock)
        zmq_socket_monitor(s->sock, NULL, 0);
    close_sock(&s->mon);
    close_sock(&s->sock);
    drop_pending(s);
}

static void free_sub(sub *s)
{
    free(s->ep);
    free(s->rep);
    free(s->topic);
    free(s);
}

/* Reads one multipart message (up to 4 frames kept). Returns the frame count, 0 when nothing
 * was waiting, or -1 for a message of more than 4 frames (drained and dropped). */
static int recv_parts(void *sock, zmq_msg_t *parts, int max)
{
    int n = 0, more = 1, over = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            return n ? -1 : 0;
        }
        more = zmq_msg_more(&m);
        if (n < max)
            parts[n++] = m;
        else {
            over = 1;
            zmq_msg_close(&m);
        }
    }
    if (over) {
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
        return -1;
    }
    return n;
}

static void close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static int read_seq(zmq_msg_t *m, uint64_t *seq)
{
    if (zmq_msg_size(m) != 8)
        return -1;
    const unsigned char *b = zmq_msg_data(m);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    *seq = v;
    return 0;
}

/* ---- replay ---- */

static void want(sub *s, int kind)
{
    if (kind > s->want_replay)
        s->want_replay = kind;
}

static void deliver(kvr_kv_ingest *ing, sub *s, uint64_t seq, kvr_kv_batch *b, size_t bytes);

static void start_replay(kvr_kv_ingest *ing, sub *s, uint64_t now)
{
    int full = s->want_replay == 2 || s->last_seq == NO_SEQ;
    if (!s->dealer && !(s->dealer = open_dealer(ing, s)))
        return;
    if (full) {
        push(ing, s, KVR_KV_OP_CLEAR, 0, NULL, 0);
        set_last(ing, s, NO_SEQ);
    }
    s->from = s->expect = full ? 0 : s->last_seq + 1;
    unsigned char req[8];
    for (int i = 0; i < 8; i++)
        req[i] = (unsigned char)(s->from >> (56 - 8 * i));
    /* Unsent (not connected yet) is like unanswered: the idle timer decides. */
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 0)
        zmq_send(s->dealer, req, 8, ZMQ_DONTWAIT);
    s->want_replay = 0;
    s->replaying = 1;
    s->full = full;
    s->partial = 0;
    s->started_ms = s->heard_ms = now;
    ing->active_replays++;
    s->ph = P_REPLAYING;
    if (s->told == KVR_KV_EXACT)
        tell(ing, s, KVR_KV_DEGRADED);
}

static void fallback(kvr_kv_ingest *ing, sub *s, uint64_t now, const char *why)
{
    /* Said once a minute at most: an endpoint that is not a publisher flaps for ever. */
    if (s->ph != P_FALLBACK && (!s->warned_ms || now - s->warned_ms >= WARN_EVERY_MS)) {
        KVR_WARN("kv-events: worker %zu (%s): %s; routing it approximately, retrying every "
                 "%llu ms", s->worker, s->ep, why, (unsigned long long)ing->cfg.retry_ms);
        s->warned_ms = now;
    }
    s->ph = P_FALLBACK;
    s->retry_at = now + ing->cfg.retry_ms;
    s->want_replay = 0;
    drop_pending(s);
    tell(ing, s, KVR_KV_FALLBACK);
}

static void end_replay(kvr_kv_ingest *ing, sub *s, uint64_t now, kvr_kv_replay_result r)
{
    s->replaying = 0;
    ing->active_replays--;
    pthread_mutex_lock(&ing->mu);
    s->st.replays[r]++;
    pthread_mutex_unlock(&ing->mu);
    if (r == KVR_KV_REPLAY_TIMEOUT || r == KVR_KV_REPLAY_ERROR) {
        /* Late answers of this request must not be read as the next one's. */
        close_sock(&s->dealer);
        if (++s->failures >= ing->cfg.replay_attempts) {
            s->failures = 0;
            fallback(ing, s, now, r == KVR_KV_REPLAY_TIMEOUT ? "replay not answered"
                                                             : "replay reply malformed");
        } else {
            want(s, 2);
        }
        return;
    }
    s->failures = 0;
    if (s->full)
        s->partial_history = r == KVR_KV_REPLAY_PARTIAL;
    s->ph = P_LIVE;
    /* Live batches that arrived meanwhile, in arrival order; the first gap starts a repair. */
    while (s->pend && !s->want_replay) {
        pending *p = s->pend;
        s->pend = p->next;
        if (!s->pend)
            s->pend_tail = NULL; /* deliver() may buffer again: never through a freed tail */
        s->npend--;
        s->pend_bytes -= p->bytes;
        uint64_t seq = p->seq;
        kvr_kv_batch *b = p->batch;
        size_t bytes = p->bytes;
        free(p);
        if (s->last_seq != NO_SEQ && seq <= s->last_seq)
            kvr_kv_batch_free(b);  /* the replay already brought it */
        else
            deliver(ing, s, seq, b, bytes);
    }
    if (!s->pend)
        s->pend_tail = NULL;
    if (!s->want_replay && s->ph == P_LIVE)
        tell(ing, s, KVR_KV_EXACT);
}

static void on_replay_msg(kvr_kv_ingest *ing, sub *s, uint64_t now)
{
    zmq_msg_t parts[4];
    int n = recv_parts(s->dealer, parts, 4);
    if (n == 0)
        return;
    if (!s->replaying) {            /* an answer nobody waits for */
        close_parts(parts, n > 0 ? n : 0);
        return;
    }
    s->heard_ms = now;
    int first = n > 0 && zmq_msg_size(&parts[0]) == 0 ? 1 : 0;
    int k = n - first;
    uint64_t seq;
    if (n < 0 || (k != 2 && k != 3) || read_seq(&parts[first + k - 2], &seq) < 0) {
        close_parts(parts, n > 0 ? n : 0);
        COUNT(ing, s, malformed);
        end_replay(ing, s, now, KVR_KV_REPLAY_ERROR);
        return;
    }
    zmq_msg_t *payload = &parts[first + k - 1];
    if (seq == NO_SEQ || zmq_msg_size(payload) == 0) {
        close_parts(parts, n);
        end_replay(ing, s, now, s->partial ? KVR_KV_REPLAY_PARTIAL : KVR_KV_REPLAY_OK);
        return;
    }
    if (seq != s->expect) {
        if (s->expect == s->from && seq > s->from) {
            if (!s->full) {
                /* The batches we missed are gone from the worker's buffer: start over. */
                close_parts(parts, n);
                COUNT(ing, s, gaps);
                end_replay(ing, s, now, KVR_KV_REPLAY_PARTIAL);
                want(s, 2);
                s->ph = P_REPLAYING;
                return;
            }
            s->partial = 1;  /* a replay from 0: take what the worker still holds */
        } else {
            close_parts(parts, n);
            end_replay(ing, s, now, KVR_KV_REPLAY_ERROR);
            return;
        }
    }
    char err[128];
    kvr_kv_batch *b = kvr_kv_decode(zmq_msg_data(payload), zmq_msg_size(payload), err,
                                    sizeof(err));
    close_parts(parts, n);
    if (!b)
        COUNT(ing, s, malformed);
    s->expect = seq + 1;
    if (s->last_seq != NO_SEQ && seq <= s->last_seq) {
        kvr_kv_batch_free(b);
        return;
    }
    if (b && push(ing, s, KVR_KV_OP_BATCH, seq, b, 0) < 0) {
        COUNT(ing, s, overflows);
        s->resync_after_overflow = 1;
    }
    set_last(ing, s, seq);
}

/* ---- live stream ---- */

static void buffer_live(kvr_kv_ingest *ing, sub *s, uint64_t seq, kvr_kv_batch *b, size_t bytes)
{
    /* Bounded in count and in bytes (one message may be --kv-events-max-bytes). */
    if (s->npend >= ing->cfg.queue_batches ||
        s->pend_bytes + bytes > ing->cfg.max_message_bytes) {
        kvr_kv_batch_free(b);  /* the gap this leaves is repaired after the replay */
        return;
    }
    pending *p = malloc(sizeof(*p));
    if (!p) {
        kvr_kv_batch_free(b);
        return;
    }
    *p = (pending){.seq = seq, .batch = b, .bytes = bytes};
    s->pend_bytes += bytes;
    if (s->pend_tail)
        s->pend_tail->next = p;
    else
        s->pend = p;
    s->pend_tail = p;
    s->npend++;
}

/* One live (or buffered) batch in LIVE phase: contiguous → delivered; else a repair. `b` may
 * be NULL (malformed payload: its seq still counts, its content is lost). */
static void deliver(kvr_kv_ingest *ing, sub *s, uint64_t seq, kvr_kv_batch *b, size_t bytes)
{
    uint64_t now = kvr_now_ms();
    /* After a full replay of an empty history the next batch is seq 0. */
    uint64_t next = s->last_seq == NO_SEQ ? 0 : s->last_seq + 1;
    if (seq == next && (s->last_seq != NO_SEQ || s->rep)) {
        if (b && push(ing, s, KVR_KV_OP_BATCH, seq, b, 0) < 0) {
            COUNT(ing, s, overflows);
            s->resync_after_overflow = 1;
            tell(ing, s, KVR_KV_DEGRADED);
        }
        set_last(ing, s, seq);
        return;
    }
    if (s->last_seq == NO_SEQ && !s->rep) {
        if (seq == 0) {  /* a fresh engine: its whole history is ahead of us */
            if (b)
                push(ing, s, KVR_KV_OP_BATCH, seq, b, 0);
            set_last(ing, s, seq);
            tell(ing, s, KVR_KV_EXACT);
        } else {
            kvr_kv_batch_free(b);
            set_last(ing, s, seq);
            fallback(ing, s, now, "no replay endpoint and the stream did not start at seq 0");
        }
        return;
    }
    int restart = s->last_seq != NO_SEQ && seq <= s->last_seq;
    if (!restart)
        COUNT(ing, s, gaps);
    if (!s->rep) {
        push(ing, s, KVR_KV_OP_CLEAR, 0, NULL, 0);
        set_last(ing, s, seq);
        if (restart && seq == 0) {  /* a fresh engine: its first batch starts the new history */
            if (b)
                push(ing, s, KVR_KV_OP_BATCH, seq, b, 0);
            tell(ing, s, KVR_KV_EXACT);
            return;
        }
        kvr_kv_batch_free(b);
        fallback(ing, s, now, "events were lost and there is no replay endpoint");
        return;
    }
    buffer_live(ing, s, seq, b, bytes);
    want(s, restart ? 2 : 1);
    s->ph = P_REPLAYING;
    tell(ing, s, KVR_KV_DEGRADED);
}

static void on_live_msg(kvr_kv_ingest *ing, sub *s)
{
    zmq_msg_t parts[4];
    int n = recv_parts(s->sock, parts, 4);
    if (n == 0)
        return;
    uint64_t seq;
    if (n != 3 || read_seq(&parts[1], &seq) < 0 || seq == NO_SEQ) {
        close_parts(parts, n > 0 ? n : 0);
        COUNT(ing, s, malformed);
        return;
    }
    char err[128];
    size_t bytes = zmq_msg_size(&parts[2]);
    kvr_kv_batch *b = kvr_kv_decode(zmq_msg_data(&parts[2]), bytes, err, sizeof(err));
    close_parts(parts, n);
    if (!b) {
        COUNT(ing, s, malformed);
        KVR_DEBUG("kv-events: worker %zu: malformed batch %llu: %s", s->worker,
                  (unsigned long long)seq, err);
    }
    switch (s->ph) {
    case P_REPLAYING:
        buffer_live(ing, s, seq, b, bytes);
        break;
    case P_LIVE:
        deliver(ing, s, seq, b, bytes);
        break;
    default:  /* connecting or fallback: the resynchronisation will fetch it */
        kvr_kv_batch_free(b);
        break;
    }
}

static void on_monitor(kvr_kv_ingest *ing, sub *s, uint64_t now)
{
    zmq_msg_t parts[4];
    int n = recv_parts(s->mon, parts, 4);
    if (n <= 0)
        return;
    uint16_t ev = 0;
    if (zmq_msg_size(&parts[0]) >= 2)
        memcpy(&ev, zmq_msg_data(&parts[0]), 2);
    close_parts(parts, n);
    pthread_mutex_lock(&ing->mu);
    s->st.connected = ev == ZMQ_EVENT_CONNECTED;
    pthread_mutex_unlock(&ing->mu);
    s->connected = ev == ZMQ_EVENT_CONNECTED;
    if (s->connected) {
        /* Joined (or rejoined) the stream: fetch its history, as llm-d does on connect. */
        s->failures = 0;
        if (s->rep)
            want(s, 2);
        else if (s->ph != P_LIVE) {
            s->ph = P_LIVE;
            set_last(ing, s, NO_SEQ);
            push(ing, s, KVR_KV_OP_CLEAR, 0, NULL, 0);
        }
        if (s->ph == P_CONNECTING || s->ph == P_FALLBACK)
            s->ph = s->rep ? P_REPLAYING : P_LIVE;
    } else if (ev == ZMQ_EVENT_DISCONNECTED) {
        fallback(ing, s, now, "event stream disconnected");
    }
}

/* ---- commands and timers ---- */

static sub *find_sub(kvr_kv_ingest *ing, size_t worker, sub ***link)
{
    sub **pp = &ing->subs;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->worker == worker)
            break;
    if (link)
        *link = pp;
    return *pp;
}

static void remove_sub(kvr_kv_ingest *ing, size_t worker)
{
    sub **link;
    sub *s = find_sub(ing, worker, &link);
    if (!s)
        return;
    pthread_mutex_lock(&ing->mu);
    *link = s->next;
    pthread_mutex_unlock(&ing->mu);
    close_sub(ing, s);
    free_sub(s);
}

static void run_cmd(kvr_kv_ingest *ing, cmd *c, uint64_t now)
{
    if (c->kind == C_REMOVE || c->kind == C_ADD)
        remove_sub(ing, c->worker);
    if (c->kind == C_ADD) {
        sub *s = calloc(1, sizeof(*s));
        if (!s)
            return;
        *s = (sub){.worker = c->worker, .gen = c->gen, .ep = c->ep, .rep = c->rep,
                   .topic = c->topic, .ph = P_CONNECTING, .told = KVR_KV_DEGRADED,
                   .since_ms = now, .last_seq = NO_SEQ};
        s->st.last_seq = NO_SEQ;
        c->ep = c->rep = c->topic = NULL;
        if (open_sub(ing, s) < 0) {
            close_sub(ing, s);
            fallback(ing, s, now, "cannot open the event sockets");
        }
        pthread_mutex_lock(&ing->mu);
        s->next = ing->subs;
        ing->subs = s;
        pthread_mutex_unlock(&ing->mu);
    } else if (c->kind == C_RESYNC) {
        sub *s = find_sub(ing, c->worker, NULL);
        if (s && s->ph != P_FALLBACK && s->ph != P_CONNECTING) {
            if (!s->rep) {
                if (c->clear)
                    fallback(ing, s, now, "resynchronisation needs a replay endpoint");
            } else {
                want(s, c->clear ? 2 : 1);
                s->ph = P_REPLAYING;
                tell(ing, s, KVR_KV_DEGRADED);
            }
        }
    }
}

static void timers(kvr_kv_ingest *ing, sub *s, uint64_t now)
{
    if (s->ph == P_CONNECTING && !s->connected &&
        now - s->since_ms >= ing->cfg.connect_timeout_ms)
        fallback(ing, s, now, "nothing listens at the event endpoint");
    if (s->replaying && (now - s->heard_ms >= ing->cfg.replay_idle_ms ||
                         now - s->started_ms >= ing->cfg.replay_max_ms))
        end_replay(ing, s, now, KVR_KV_REPLAY_TIMEOUT);
    if (s->ph == P_FALLBACK && s->connected && s->sock && now >= s->retry_at) {
        if (s->rep) {
            want(s, 2);
            s->ph = P_REPLAYING;
        } else {
            s->retry_at = now + ing->cfg.retry_ms;  /* only an engine restart can help */
        }
    }
    /* Disconnected for good? libzmq does not redial after a protocol error (a message over
     * --kv-events-max-bytes): a fresh socket does. */
    if (s->ph == P_FALLBACK && !s->connected && now >= s->retry_at) {
        close_sub(ing, s);
        s->ph = P_CONNECTING;
        s->since_ms = now;
        s->retry_at = now + ing->cfg.retry_ms;
        if (open_sub(ing, s) < 0) {
            close_sub(ing, s);
            fallback(ing, s, now, "cannot open the event sockets");
        }
    }
    if (s->resync_after_overflow) {
        pthread_mutex_lock(&ing->mu);
        int room = ing->nbatches < ing->cfg.queue_batches / 2 + 1;
        pthread_mutex_unlock(&ing->mu);
        if (room) {
            s->resync_after_overflow = 0;
            if (s->rep) {
                want(s, 2);
                s->ph = P_REPLAYING;
            } else {
                push(ing, s, KVR_KV_OP_CLEAR, 0, NULL, 0);
                fallback(ing, s, now, "event queue overflowed and there is no replay endpoint");
            }
        }
    }
    if (s->want_replay && !s->replaying && s->ph == P_REPLAYING &&
        ing->active_replays < ing->cfg.max_concurrent_replays)
        start_replay(ing, s, now);
}

static void *thread_main(void *arg)
{
    kvr_kv_ingest *ing = arg;
    zmq_pollitem_t *items = NULL;
    sub **owners = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&ing->mu);
        int stop = ing->stop;
        cmd *cs = ing->cmds;
        ing->cmds = ing->cmds_tail = NULL;
        pthread_mutex_unlock(&ing->mu);
        uint64_t now = kvr_now_ms();
        while (cs) {
            cmd *c = cs;
            cs = c->next;
            if (!stop)
                run_cmd(ing, c, now);
            free(c->ep);
            free(c->rep);
            free(c->topic);
            free(c);
        }
        if (stop)
            break;
        size_t n = 0, need = 0;
        for (sub *s = ing->subs; s; s = s->next)
            need += 3;
        if (need > cap) {
            zmq_pollitem_t *ni = realloc(items, need * sizeof(*ni));
            if (ni)
                items = ni;
            sub **no = realloc(owners, need * sizeof(*no));
            if (no)
                owners = no;
            if (ni && no)
                cap = need;
        }
        for (sub *s = ing->subs; s && n + 3 <= cap; s = s->next) {
            void *socks[3] = {s->sock, s->dealer, s->mon};
            for (int i = 0; i < 3; i++)
                if (socks[i]) {
                    items[n] = (zmq_pollitem_t){.socket = socks[i], .events = ZMQ_POLLIN};
                    owners[n++] = s;
                }
        }
        /* With no items zmq_poll just sleeps for the timeout. */
        int rc = zmq_poll(items, (int)n, POLL_MS);
        now = kvr_now_ms();
        for (size_t i = 0; rc > 0 && i < n; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            sub *s = owners[i];
            /* Bounded per round so one busy worker cannot starve the others. */
            for (int k = 0; k < 64; k++) {
                if (items[i].socket == s->sock && s->sock)
                    on_live_msg(ing, s);
                else if (items[i].socket == s->dealer && s->dealer)
                    on_replay_msg(ing, s, now);
                else if (items[i].socket == s->mon && s->mon)
                    on_monitor(ing, s, now);
                else
                    break;
                /* A handler may have closed this socket (replay failure). */
                if (items[i].socket != s->sock && items[i].socket != s->dealer &&
                    items[i].socket != s->mon)
                    break;
                int ev = 0;
                size_t sz = sizeof(ev);
                if (zmq_getsockopt(items[i].socket, ZMQ_EVENTS, &ev, &sz) || !(ev & ZMQ_POLLIN))
                    break;
            }
        }
        for (sub *s = ing->subs; s; s = s->next)
            timers(ing, s, now);
    }
    while (ing->subs) {
        sub *s = ing->subs;
        ing->subs = s->next;
        close_sub(ing, s);
        free_sub(s);
    }
    free(items);
    free(owners);
    return NULL;
}

/* ---- the loop side ---- */

static void on_async(uv_async_t *a)
{
    kvr_kv_ingest *ing = a->data;
    ing->notify(ing->ud);
}

kvr_kv_ingest *kvr_kv_ingest_new(uv_loop_t *loop, const kvr_kv_ingest_cfg *cfg,
                                 kvr_kv_ingest_notify notify, void *ud, char *err, size_t errlen)
{
    kvr_kv_ingest *ing = calloc(1, sizeof(*ing));
    if (!ing) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ing->cfg = *cfg;
    ing->notify = notify;
    ing->ud = ud;
    ing->zctx = zmq_ctx_new();
    if (!ing->zctx) {
        snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(errno));
        free(ing);
        return NULL;
    }
    pthread_mutex_init(&ing->mu, NULL);
    uv_async_init(loop, &ing->async, on_async);
    ing->async.data = ing;
    int rc = pthread_create(&ing->thread, NULL, thread_main, ing);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the KV-event thread: %s", strerror(rc));
        kvr_kv_ingest_close(ing);
        return NULL;
    }
    ing->started = 1;
    return ing;
}

static void on_closed(uv_handle_t *h)
{
    kvr_kv_ingest *ing = h->data;
    kvr_kv_op *op = ing->ops;
    while (op) {
        kvr_kv_op *next = op->next;
        kvr_kv_op_free(op);
        op = next;
    }
    pthread_mutex_destroy(&ing->mu);
    free(ing);
}

void kvr_kv_ingest_close(kvr_kv_ingest *ing)
{
    if (!ing)
        return;
    pthread_mutex_lock(&ing->mu);
    ing->stop = 1;
    pthread_mutex_unlock(&ing->mu);
    if (ing->started)
        pthread_join(ing->thread, NULL);
    while (ing->cmds) {
        cmd *c = ing->cmds;
        ing->cmds = c->next;
        free(c->ep);
        free(c->rep);
        free(c->topic);
        free(c);
    }
    zmq_ctx_term(ing->zctx);
    uv_close((uv_handle_t *)&ing->async, on_closed);
}

static uint64_t post(kvr_kv_ingest *ing, cmd_kind kind, size_t worker, int clear, const char *ep,
                     const char *rep, const char *topic)
{
    cmd *c = calloc(1, sizeof(*c));
    if (!c)
        return 0;
    *c = (cmd){.kind = kind, .worker = worker, .clear = clear,
               .ep = ep ? strdup(ep) : NULL, .rep = rep ? strdup(rep) : NULL,
               .topic = strdup(topic ? topic : "")};
    if ((ep && !c->ep) || (rep && !c->rep) || !c->topic) {
        free(c->ep);
        free(c->rep);
        free(c->topic);
        free(c);
        return 0;
    }
    pthread_mutex_lock(&ing->mu);
    c->gen = ++ing->next_gen;
    uint64_t gen = c->gen;
    if (ing->cmds_tail)
        ing->cmds_tail->next = c;
    else
        ing->cmds = c;
    ing->cmds_tail = c;
    pthread_mutex_unlock(&ing->mu);
    return gen;
}

uint64_t kvr_kv_ingest_add(kvr_kv_ingest *ing, size_t worker, const char *sub, const char *replay,
                           const char *topic)
{
    return post(ing, C_ADD, worker, 0, sub, replay, topic);
}

void kvr_kv_ingest_remove(kvr_kv_ingest *ing, size_t worker)
{
    post(ing, C_REMOVE, worker, 0, NULL, NULL, NULL);
}

void kvr_kv_ingest_resync(kvr_kv_ingest *ing, size_t worker, int clear)
{
    post(ing, C_RESYNC, worker, clear, NULL, NULL, NULL);
}

kvr_kv_op *kvr_kv_ingest_take(kvr_kv_ingest *ing)
{
    pthread_mutex_lock(&ing->mu);
    kvr_kv_op *ops = ing->ops;
    ing->ops = ing->ops_tail = NULL;
    ing->nbatches = 0;
    pthread_mutex_unlock(&ing->mu);
    return ops;
}

int kvr_kv_ingest_stats(kvr_kv_ingest *ing, size_t worker, kvr_kv_stream_stats *out)
{
    int rc = -1;
    pthread_mutex_lock(&ing->mu);
    for (sub *s = ing->subs; s; s = s->next)
        if (s->worker == worker) {
            *out = s->st;
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&ing->mu);
    return rc;
}
