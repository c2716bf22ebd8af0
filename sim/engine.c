/* Building and tearing down the engine ranks of kvroute-sim. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>

static void flush_rank(void *ud)
{
    kvr_sim_engine *e = ud;
    kvr_sim_events_flush_rank(e->events, e->ev_idx);
}

/* The publisher of rank `r` (`n` ranks); NULL with `err` on failure. */
static kvr_sim_events *open_events(uv_loop_t *loop, const kvr_sim_config *c, int r, size_t n,
                                   kvr_sim_faults *faults, char *err, size_t cap)
{
    char ep[512], rep[512];
    if (kvr_sim_events_offset_endpoint(c->kv_events_endpoint, r, ep, sizeof(ep)) < 0 ||
        (c->kv_events_replay_endpoint && *c->kv_events_replay_endpoint &&
         kvr_sim_events_offset_endpoint(c->kv_events_replay_endpoint, r, rep, sizeof(rep)) < 0)) {
        snprintf(err, cap, "cannot offset the kv-events endpoints for data-parallel rank %d "
                 "(tcp://HOST:PORT, ipc:// or inproc:// needed; or --kv-events-dp shared)", r);
        return NULL;
    }
    kvr_sim_events_cfg ec = {
        .endpoint = ep,
        .replay_endpoint = c->kv_events_replay_endpoint && *c->kv_events_replay_endpoint ? rep
                                                                                         : NULL,
        .topic = c->kv_events_topic,
        .map_format = c->kv_events_map,
        .bind = c->kv_events_bind,
        .hwm = c->kv_events_hwm,
        .buffer_steps = c->kv_events_buffer_steps,
        .buffer_bytes = c->kv_events_buffer_bytes,
        .max_batch_bytes = c->kv_events_max_batch_bytes,
        .dp_rank = r,
        .nranks = n,
        .faults = faults,
    };
    return kvr_sim_events_new(loop, &ec, err, cap);
}

kvr_sim_engine *kvr_sim_engines_new(uv_loop_t *loop, const kvr_sim_config *c, kvr_metrics *reg,
                                    kvr_sim_faults *faults, char *err, size_t cap)
{
    size_t n = c->data_parallel_size ? c->data_parallel_size : 1;
    int shared = c->kv_events_dp_shared;
    kvr_sim_engine *es = calloc(n, sizeof(*es));
    if (!es) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        kvr_sim_engine *e = &es[i];
        e->rank = (int)i;
        e->kv = kvr_sim_kv_new(c->kv_blocks, c->block_size, c->seed);
        if (!e->kv) {
            snprintf(err, cap, "cannot create the KV pool of rank %zu (kv_blocks=%u)", i,
                     c->kv_blocks);
            goto fail;
        }
        if (c->kv_events_endpoint && *c->kv_events_endpoint) {
            if (!shared || i == 0) {
                e->events = open_events(loop, c, shared ? 0 : e->rank, shared ? n : 1, faults,
                                        err, cap);
                if (!e->events)
                    goto fail;
                e->owns_events = 1;
            } else {
                e->events = es[0].events;
                e->ev_idx = i;
            }
            kvr_sim_kv_sink sink;
            kvr_sim_events_sink_rank(e->events, e->ev_idx, &sink);
            kvr_sim_kv_set_sink(e->kv, &sink);
        }
        kvr_sim_sched_cfg sc = {
            .max_num_seqs = c->max_num_seqs,
            .max_num_batched_tokens = c->max_num_batched_tokens,
            .prefill_us_per_token = c->prefill_us_per_token,
            .decode_us_per_token = c->decode_us_per_token,
            .step_overhead_us = c->step_overhead_us,
            .decode_us_per_kv_token = c->decode_us_per_kv_token,
            .time_scale = c->time_scale,
            .seed = c->seed,
            .on_step_done = e->events ? flush_rank : NULL,
            .ud = e,
        };
        e->sched = kvr_sim_sched_new(loop, e->kv, &sc);
        e->vm = e->sched ? kvr_sim_vmetrics_new(reg, c->model, e->rank, e->sched, e->kv) : NULL;
        if (!e->vm) {
            snprintf(err, cap, "out of memory at start");
            goto fail;
        }
    }
    return es;
fail:
    kvr_sim_engines_close(es, n);
    /* the publishers and schedulers finish closing on the loop; run it until they have */
    uv_run(loop, UV_RUN_DEFAULT);
    kvr_sim_engines_free(es, n);
    return NULL;
}

void kvr_sim_engines_close(kvr_sim_engine *es, size_t n)
{
    for (size_t i = 0; es && i < n; i++) {
        if (es[i].sched)
            kvr_sim_sched_close(es[i].sched);
        es[i].sched = NULL;
        if (es[i].owns_events)
            kvr_sim_events_close(es[i].events);
        es[i].events = NULL;
        es[i].owns_events = 0;
    }
}

void kvr_sim_engines_free(kvr_sim_engine *es, size_t n)
{
    for (size_t i = 0; es && i < n; i++) {
        kvr_sim_vmetrics_free(es[i].vm);
        kvr_sim_kv_free_pool(es[i].kv);
    }
    free(es);
}
