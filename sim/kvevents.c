/* vLLM-format KV events: msgpack encoding (msgpack-c) and ZMQ PUB + ROUTER replay (libzmq). */
#include "kvevents.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <zmq.h>

#include "util/log.h"

/* ---- encoder ---- */

static int buf_write(void *data, const char *p, size_t n)
{
    return kvr_buf_append((kvr_buf *)data, p, n);
}

static void packer(msgpack_packer *pk, kvr_buf *b)
{
    msgpack_packer_init(pk, b, buf_write);
}

static int pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

void kvr_sim_evbatch_init(kvr_sim_evbatch *b, int map, size_t cap_bytes)
{
    memset(b, 0, sizeof(*b));
    kvr_buf_init(&b->events, cap_bytes);
    b->map = map;
}

void kvr_sim_evbatch_free(kvr_sim_evbatch *b)
{
    kvr_buf_free(&b->events);
    b->nevents = 0;
}

/* Undoes a partly written event. */
static int done(kvr_sim_evbatch *b, size_t mark, int rc)
{
    if (rc) {
        b->events.len = mark;
        return -1;
    }
    b->nevents++;
    return 0;
}

static int key(msgpack_packer *pk, int map, const char *k)
{
    return map ? pack_str(pk, k) : 0;
}

int kvr_sim_evbatch_stored(kvr_sim_evbatch *b, const uint64_t *hashes, size_t n, int has_parent,
                           uint64_t parent, const uint32_t *tokens, size_t ntokens,
                           uint32_t block_size)
{
    size_t mark = b->events.len;
    msgpack_packer pk;
    packer(&pk, &b->events);
    int rc = 0;
    if (b->map)
        rc |= msgpack_pack_map(&pk, 11) | pack_str(&pk, "type");
    else
        rc |= msgpack_pack_array(&pk, 11);
    rc |= pack_str(&pk, "BlockStored");
    rc |= key(&pk, b->map, "block_hashes") | msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n && !rc; i++)
        rc |= msgpack_pack_uint64(&pk, hashes[i]);
    rc |= key(&pk, b->map, "parent_block_hash");
    rc |= has_parent ? msgpack_pack_uint64(&pk, parent) : msgpack_pack_nil(&pk);
    rc |= key(&pk, b->map, "token_ids") | msgpack_pack_array(&pk, ntokens);
    for (size_t i = 0; i < ntokens && !rc; i++)
        rc |= msgpack_pack_uint32(&pk, tokens[i]);
    rc |= key(&pk, b->map, "block_size") | msgpack_pack_uint32(&pk, block_size);
    rc |= key(&pk, b->map, "lora_id") | msgpack_pack_nil(&pk);
    rc |= key(&pk, b->map, "medium") | pack_str(&pk, "GPU");
    rc |= key(&pk, b->map, "lora_name") | msgpack_pack_nil(&pk);
    rc |= key(&pk, b->map, "extra_keys") | msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n && !rc; i++)
        rc |= msgpack_pack_nil(&pk);
    rc |= key(&pk, b->map, "group_idx") | msgpack_pack_uint32(&pk, 0);
    rc |= key(&pk, b->map, "kv_cache_spec_kind") | pack_str(&pk, "full_attention");
    return done(b, mark, rc);
}

int kvr_sim_evbatch_removed(kvr_sim_evbatch *b, uint64_t hash)
{
    size_t mark = b->events.len;
    msgpack_packer pk;
    packer(&pk, &b->events);
    int rc = 0;
    if (b->map)
        rc |= msgpack_pack_map(&pk, 4) | pack_str(&pk, "type");
    else
        rc |= msgpack_pack_array(&pk, 4);
    rc |= pack_str(&pk, "BlockRemoved");
    rc |= key(&pk, b->map, "block_hashes") | msgpack_pack_array(&pk, 1) |
          msgpack_pack_uint64(&pk, hash);
    rc |= key(&pk, b->map, "medium") | pack_str(&pk, "GPU");
    rc |= key(&pk, b->map, "group_idx") | msgpack_pack_uint32(&pk, 0);
    return done(b, mark, rc);
}

int kvr_sim_evbatch_cleared(kvr_sim_evbatch *b)
{
    size_t mark = b->events.len;
    msgpack_packer pk;
    packer(&pk, &b->events);
    int rc;
    if (b->map)
        rc = msgpack_pack_map(&pk, 1) | pack_str(&pk, "type");
    else
        rc = msgpack_pack_array(&pk, 1);
    rc |= pack_str(&pk, "AllBlocksCleared");
    return done(b, mark, rc);
}

int kvr_sim_evbatch_finish(kvr_sim_evbatch *b, double ts, int dp_rank, kvr_buf *out)
{
    size_t mark = out->len;
    msgpack_packer pk;
    packer(&pk, out);
    int rc = msgpack_pack_array(&pk, 3) | msgpack_pack_double(&pk, ts) |
             msgpack_pack_array(&pk, b->nevents);
    if (!rc && b->events.len)
        rc = kvr_buf_append(out, b->events.data, b->events.len);
    rc |= msgpack_pack_int(&pk, dp_rank);
    kvr_buf_reset(&b->events);
    b->nevents = 0;
    if (rc) {
        out->len = mark;
        return -1;
    }
    return 0;
}

/* ---- publisher ---- */

typedef struct stored_batch {
    uint64_t seq;
    char *data;
    size_t len;
} stored_batch;

/* One data-parallel rank's pending batch; the sink of that rank's pool points here. */
typedef struct rank_batch {
    kvr_sim_events *ev;
    int dp_rank;
    kvr_sim_evbatch batch;
} rank_batch;

struct kvr_sim_events {
    void *ctx, *pub, *router;
    uv_poll_t poll;
    int polling;
    char *topic;
    size_t topic_len;
    rank_batch *ranks;
    size_t nranks;
    kvr_buf payload;
    uint64_t seq;
    uint64_t dropped;
    kvr_sim_faults *faults;
    uint64_t batches_dropped, replays_ignored;
    /* replay ring */
    stored_batch *ring;
    size_t ring_cap, ring_head, ring_len, ring_bytes, ring_max_bytes;
};

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static int wants_bind(const char *ep)
{
    /* vLLM's ZmqEventPublisher heuristic. */
    return strchr(ep, '*') || strstr(ep, "::") || strncmp(ep, "ipc://", 6) == 0 ||
           strncmp(ep, "inproc://", 9) == 0;
}

static void ring_drop_oldest(kvr_sim_events *ev)
{
    stored_batch *s = &ev->ring[ev->ring_head];
    ev->ring_bytes -= s->len;
    free(s->data);
    s->data = NULL;
    ev->ring_head = (ev->ring_head + 1) % ev->ring_cap;
    ev->ring_len--;
}

static void ring_push(kvr_sim_events *ev, uint64_t seq, const char *p, size_t n)
{
    if (!ev->ring_cap || n > ev->ring_max_bytes)
        return;
    char *copy = malloc(n ? n : 1);
    if (!copy)
        return;
    memcpy(copy, p, n);
    while (ev->ring_len && (ev->ring_len == ev->ring_cap || ev->ring_bytes + n > ev->ring_max_bytes))
        ring_drop_oldest(ev);
    stored_batch *s = &ev->ring[(ev->ring_head + ev->ring_len) % ev->ring_cap];
    s->seq = seq;
    s->data = copy;
    s->len = n;
    ev->ring_len++;
    ev->ring_bytes += n;
}

static void send_frames(void *sock, const void *const *parts, const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (zmq_send(sock, parts[i], lens[i], ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
            return; /* ROUTER/PUB drop silently past HWM; nothing else to do */
}

/* Receives one whole request into part[] (up to 4 frames kept). Returns the number of frames
 * kept, 0 when nothing is waiting, or -1 for a request of another shape (already freed). */
static int recv_request(kvr_sim_events *ev, zmq_msg_t part[4])
{
    int nparts = 0, more = 1, bad = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (nparts == 0)
                return 0;
            bad = 1; /* a multipart message arrives whole; defensive */
            break;
        }
        more = zmq_msg_more(&m);
        if (nparts < 4) {
            part[nparts++] = m;
        } else {
            zmq_msg_close(&m);
            bad = 1;
        }
    }
    if (!bad && nparts == 3 && zmq_msg_size(&part[1]) == 0 && zmq_msg_size(&part[2]) == 8)
        return nparts;
    KVR_WARN("msg=\"kv-events replay: ignored a malformed request\" frames=%d", nparts);
    for (int i = 0; i < nparts; i++)
        zmq_msg_close(&part[i]);
    return -1;
}

static void answer_replay(kvr_sim_events *ev, const void *id, size_t idlen, uint64_t start)
{
    unsigned char seqb[8];
    for (size_t k = 0; k < ev->ring_len; k++) {
        const stored_batch *s = &ev->ring[(ev->ring_head + k) % ev->ring_cap];
        if (s->seq < start)
            continue;
        put_be64(seqb, s->seq);
        const void *parts[5] = {id, "", ev->topic, seqb, s->data};
        size_t lens[5] = {idlen, 0, ev->topic_len, 8, s->len};
        send_frames(ev->router, parts, lens, 5);
    }
    memset(seqb, 0xff, 8); /* END_SEQ = (-1).to_bytes(8, "big", signed=True) */
    const void *parts[5] = {id, "", ev->topic, seqb, ""};
    size_t lens[5] = {idlen, 0, ev->topic_len, 8, 0};
    send_frames(ev->router, parts, lens, 5);
}

static void serve_replay(kvr_sim_events *ev)
{
    for (;;) {
        zmq_msg_t part[4];
        int nparts = recv_request(ev, part);
        if (nparts == 0)
            return; /* drained */
        if (nparts < 0)
            continue;
        /* the request is still read, so the socket drains and the poll does not spin */
        if (ev->faults && ev->faults->replay_silent)
            ev->replays_ignored++;
        else
            answer_replay(ev, zmq_msg_data(&part[0]), zmq_msg_size(&part[0]),
                          get_be64(zmq_msg_data(&part[2])));
        for (int i = 0; i < nparts; i++)
            zmq_msg_close(&part[i]);
    }
}

static void on_router(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    kvr_sim_events *ev = h->data;
    /* ZMQ_FD is edge-like: drain until ZMQ_EVENTS no longer says POLLIN (our own sends can
     * consume the edge of a request that arrived meanwhile, so re-check after serving). */
    for (;;) {
        int zev = 0;
        size_t sz = sizeof(zev);
        if (zmq_getsockopt(ev->router, ZMQ_EVENTS, &zev, &sz) < 0 || !(zev & ZMQ_POLLIN))
            return;
        serve_replay(ev);
    }
}

static void free_ranks(kvr_sim_events *ev)
{
    for (size_t i = 0; ev->ranks && i < ev->nranks; i++)
        kvr_sim_evbatch_free(&ev->ranks[i].batch);
    free(ev->ranks);
    ev->ranks = NULL;
}

static void set_err(char *err, size_t errlen, const char *what, const char *ep)
{
    snprintf(err, errlen, "%s %s: %s", what, ep, zmq_strerror(zmq_errno()));
}

kvr_sim_events *kvr_sim_events_new(uv_loop_t *loop, const kvr_sim_events_cfg *cfg, char *err,
                                   size_t errlen)
{
    kvr_sim_events *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const char *topic = cfg->topic ? cfg->topic : "";
    ev->topic = strdup(topic);
    ev->topic_len = strlen(topic);
    ev->faults = cfg->faults;
    ev->nranks = cfg->nranks ? cfg->nranks : 1;
    ev->ranks = calloc(ev->nranks, sizeof(*ev->ranks));
    for (size_t i = 0; ev->ranks && i < ev->nranks; i++) {
        ev->ranks[i].ev = ev;
        ev->ranks[i].dp_rank = cfg->dp_rank + (int)i;
        kvr_sim_evbatch_init(&ev->ranks[i].batch, cfg->map_format, cfg->max_batch_bytes);
    }
    kvr_buf_init(&ev->payload, 0);
    ev->ring_cap = cfg->buffer_steps;
    ev->ring_max_bytes = cfg->buffer_bytes;
    if (ev->ring_cap)
        ev->ring = calloc(ev->ring_cap, sizeof(stored_batch));
    ev->ctx = zmq_ctx_new();
    if (!ev->topic || !ev->ranks || (ev->ring_cap && !ev->ring) || !ev->ctx) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    ev->pub = zmq_socket(ev->ctx, ZMQ_PUB);
    int hwm = cfg->hwm, linger = 200;
    zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(ev->pub, ZMQ_LINGER, &linger, sizeof(linger));
    int bind = cfg->bind == KVR_SIM_EV_BIND ||
               (cfg->bind == KVR_SIM_EV_AUTO && wants_bind(cfg->endpoint));
    if ((bind ? zmq_bind(ev->pub, cfg->endpoint) : zmq_connect(ev->pub, cfg->endpoint)) < 0) {
        set_err(err, errlen, bind ? "cannot bind kv-events endpoint" : "cannot connect",
                cfg->endpoint);
        goto fail;
    }
    if (cfg->replay_endpoint && *cfg->replay_endpoint) {
        ev->router = zmq_socket(ev->ctx, ZMQ_ROUTER);
        /* A full replay must not be cut by the default HWM (1000): the ring's byte cap bounds
         * what one client can queue. */
        int rhwm = 0;
        zmq_setsockopt(ev->router, ZMQ_SNDHWM, &rhwm, sizeof(rhwm));
        zmq_setsockopt(ev->router, ZMQ_LINGER, &linger, sizeof(linger));
        if (zmq_bind(ev->router, cfg->replay_endpoint) < 0) {
            set_err(err, errlen, "cannot bind kv-events replay endpoint", cfg->replay_endpoint);
            goto fail;
        }
        int fd;
        size_t sz = sizeof(fd);
        zmq_getsockopt(ev->router, ZMQ_FD, &fd, &sz);
        uv_poll_init(loop, &ev->poll, fd);
        ev->poll.data = ev;
        uv_poll_start(&ev->poll, UV_READABLE, on_router);
        ev->polling = 1;
    }
    return ev;
fail:
    if (ev->pub)
        zmq_close(ev->pub);
    if (ev->router)
        zmq_close(ev->router);
    if (ev->ctx)
        zmq_ctx_term(ev->ctx);
    free_ranks(ev);
    free(ev->ring);
    free(ev->topic);
    free(ev);
    return NULL;
}

kvr_sim_evbatch *kvr_sim_events_batch(kvr_sim_events *ev)
{
    return &ev->ranks[0].batch;
}

uint64_t kvr_sim_events_next_seq(const kvr_sim_events *ev)
{
    return ev->seq;
}

uint64_t kvr_sim_events_dropped(const kvr_sim_events *ev)
{
    return ev->dropped;
}

uint64_t kvr_sim_events_batches_dropped(const kvr_sim_events *ev)
{
    return ev->batches_dropped;
}

uint64_t kvr_sim_events_replays_ignored(const kvr_sim_events *ev)
{
    return ev->replays_ignored;
}

static void sink_stored(void *ud, const uint64_t *hashes, size_t n, int has_parent,
                        uint64_t parent, const uint32_t *tokens, size_t ntokens,
                        uint32_t block_size)
{
    rank_batch *rb = ud;
    if (kvr_sim_evbatch_stored(&rb->batch, hashes, n, has_parent, parent, tokens, ntokens,
                               block_size) < 0)
        rb->ev->dropped++;
}

static void sink_removed(void *ud, uint64_t hash)
{
    rank_batch *rb = ud;
    if (kvr_sim_evbatch_removed(&rb->batch, hash) < 0)
        rb->ev->dropped++;
}

static void sink_cleared(void *ud)
{
    rank_batch *rb = ud;
    if (kvr_sim_evbatch_cleared(&rb->batch) < 0)
        rb->ev->dropped++;
}

void kvr_sim_events_sink_rank(kvr_sim_events *ev, size_t idx, kvr_sim_kv_sink *sink)
{
    sink->stored = sink_stored;
    sink->removed = sink_removed;
    sink->cleared = sink_cleared;
    sink->ud = &ev->ranks[idx < ev->nranks ? idx : 0];
}

void kvr_sim_events_sink(kvr_sim_events *ev, kvr_sim_kv_sink *sink)
{
    kvr_sim_events_sink_rank(ev, 0, sink);
}

void kvr_sim_events_flush(kvr_sim_events *ev)
{
    for (size_t i = 0; i < ev->nranks; i++)
        kvr_sim_events_flush_rank(ev, i);
}

void kvr_sim_events_flush_rank(kvr_sim_events *ev, size_t idx)
{
    if (idx >= ev->nranks)
        return;
    rank_batch *rb = &ev->ranks[idx];
    if (rb->batch.nevents == 0)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double ts = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
    kvr_buf_reset(&ev->payload);
    size_t nevents = rb->batch.nevents;
    if (kvr_sim_evbatch_finish(&rb->batch, ts, rb->dp_rank, &ev->payload) < 0) {
        ev->dropped += nevents;
        return;
    }
    unsigned char seqb[8];
    put_be64(seqb, ev->seq);
    const void *parts[3] = {ev->topic, seqb, ev->payload.data};
    size_t lens[3] = {ev->topic_len, 8, ev->payload.len};
    if (ev->faults && ev->faults->drop_event_batches > 0) {
        ev->faults->drop_event_batches--;
        ev->batches_dropped++;
    } else {
        send_frames(ev->pub, parts, lens, 3);
    }
    ring_push(ev, ev->seq, ev->payload.data, ev->payload.len);
    ev->seq++;
}

int kvr_sim_events_offset_endpoint(const char *ep, int rank, char *out, size_t cap)
{
    int w;
    if (rank == 0) {
        w = snprintf(out, cap, "%s", ep);
    } else if (strncmp(ep, "inproc://", 9) == 0 || strncmp(ep, "ipc://", 6) == 0) {
        w = snprintf(out, cap, "%s_dp%d", ep, rank);
    } else if (strncmp(ep, "tcp://", 6) == 0) {
        const char *colon = strrchr(ep + 6, ':');
        if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
            strlen(colon + 1) > 5)
            return -1;
        long port = strtol(colon + 1, NULL, 10) + rank;
        if (rank < 0 || port > 65535)
            return -1;
        w = snprintf(out, cap, "%.*s:%ld", (int)(colon - ep), ep, port);
    } else {
        return -1;
    }
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

static void on_poll_closed(uv_handle_t *h)
{
    kvr_sim_events *ev = h->data;
    if (ev->router)
        zmq_close(ev->router);
    zmq_close(ev->pub);
    zmq_ctx_term(ev->ctx);
    while (ev->ring_len)
        ring_drop_oldest(ev);
    free(ev->ring);
    free_ranks(ev);
    kvr_buf_free(&ev->payload);
    free(ev->topic);
    free(ev);
}

void kvr_sim_events_close(kvr_sim_events *ev)
{
    if (!ev)
        return;
    if (ev->polling) {
        uv_poll_stop(&ev->poll);
        uv_close((uv_handle_t *)&ev->poll, on_poll_closed);
    } else {
        ev->poll.data = ev;
        on_poll_closed((uv_handle_t *)&ev->poll);
    }
}
