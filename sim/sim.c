/* kvroute-sim wiring and lifetime: start everything on one loop, stop on SIGINT/SIGTERM. */
#include "sim.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "api.h"
#include "engine.h"
#include "http/server.h"
#include "obs/metrics.h"
#include "profile.h"
#include "util/log.h"
#include "util/rand.h"

void kvr_sim_config_default(kvr_sim_config *c)
{
    *c = (kvr_sim_config){
        .host = "127.0.0.1",
        .port = 9001,
        .model = "meta-llama/Llama-3.1-8B-Instruct",
        .kv_blocks = 28000,
        .block_size = 16,
        .max_num_seqs = 256,
        .max_num_batched_tokens = 8192,
        .max_model_len = 131072,
        .default_max_tokens = 16,
        .prefill_us_per_token = 25,
        .decode_us_per_token = 80,
        .step_overhead_us = 6000,
        .time_scale = 1,
        .kv_events_topic = "",
        .kv_events_bind = KVR_SIM_EV_AUTO,
        .kv_events_hwm = 100000,
        .kv_events_buffer_steps = 10000,
        .kv_events_buffer_bytes = 64u << 20,
        .kv_events_max_batch_bytes = 16u << 20,
        .seed = 0,
        .max_waiting = 10000,
        .max_body_bytes = 32u << 20,
        .detokenize_cache_entries = 65536,
        .max_stored_responses = 10000,
        .data_parallel_size = 1,
        .kv_hold_ms = 480000,
        .kv_hold_max_requests = 10000,
        .kv_transfer_us_per_block = 80,
        .kv_transfer_timeout_ms = 30000,
        .request_log_size = 1000,
    };
    kvr_sim_faults_default(&c->faults);
}

int kvr_sim_config_apply_profile(kvr_sim_config *c, const char *name)
{
    const kvr_sim_profile *p = kvr_sim_profile_find(name);
    if (!p)
        return -1;
    c->profile = p->name;
    c->model = p->model;
    c->kv_blocks = p->kv_blocks;
    c->block_size = KVR_SIM_PROFILE_BLOCK_SIZE;
    c->max_num_seqs = p->max_num_seqs;
    c->max_num_batched_tokens = p->max_num_batched_tokens;
    c->max_model_len = p->max_model_len;
    c->step_overhead_us = p->timing.step_overhead_us;
    c->prefill_us_per_token = p->timing.prefill_us_per_token;
    c->decode_us_per_token = p->timing.decode_us_per_token;
    c->decode_us_per_kv_token = p->timing.decode_us_per_kv_token;
    return 0;
}

typedef struct sim {
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    kvr_http_server *server, *bootstrap; /* bootstrap: SGLang's handshake port, or NULL */
    int open_servers;
    kvr_sim_pd *pd;
    kvr_sim_engine *eng;
    size_t neng;
    kvr_metrics *reg;
    kvr_sim_api *api;
    kvr_sim_faults faults;
    int stopping;
} sim;

static void on_server_closed(void *ud)
{
    sim *s = ud;
    if (--s->open_servers > 0)
        return;
    kvr_sim_pd_close(s->pd);
    kvr_sim_engines_close(s->eng, s->neng);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
}

static void close_servers(sim *s)
{
    s->open_servers = s->bootstrap ? 2 : 1;
    if (s->bootstrap)
        kvr_http_server_close(s->bootstrap, on_server_closed, s);
    kvr_http_server_close(s->server, on_server_closed, s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    sim *s = h->data;
    if (s->stopping)
        return;
    s->stopping = 1;
    KVR_INFO("msg=\"kvroute-sim stopping\" signal=%d", signum);
    close_servers(s);
}

int kvr_sim_run(const kvr_sim_config *c)
{
    signal(SIGPIPE, SIG_IGN); /* libuv does not suppress it on writes to a closed peer */
    kvr_rand_seed(c->seed);
    sim s = {0};
    s.faults = c->faults;
    uv_loop_init(&s.loop);
    s.reg = kvr_metrics_new();
    kvr_metrics_add_process(s.reg);
    char err[300];
    s.neng = c->data_parallel_size ? c->data_parallel_size : 1;
    s.eng = kvr_sim_engines_new(&s.loop, c, s.reg, &s.faults, err, sizeof(err));
    if (!s.eng) {
        KVR_ERROR("msg=\"%s\"", err);
        kvr_metrics_free(s.reg);
        return 1;
    }
    kvr_sim_pd_cfg pc = {.role = (kvr_sim_role)c->role,
                         .hold_ms = c->kv_hold_ms,
                         .hold_max = c->kv_hold_max_requests,
                         .transfer_us_per_block = c->kv_transfer_us_per_block,
                         .time_scale = c->time_scale,
                         .transfer_timeout_ms = c->kv_transfer_timeout_ms,
                         .host = c->host,
                         .max_blocks = c->max_model_len / c->block_size + 1,
                         .bootstrap_port = c->bootstrap_port};
    s.pd = kvr_sim_pd_new(&s.loop, &pc, s.reg, &s.faults);
    kvr_sim_api_cfg ac = {.model = c->model,
                          .max_model_len = c->max_model_len,
                          .default_max_tokens = c->default_max_tokens,
                          .max_waiting = c->max_waiting,
                          .seed = c->seed,
                          .detokenize_cache_entries = c->detokenize_cache_entries,
                          .max_stored_responses = c->max_stored_responses,
                          .profile = c->profile,
                          .request_log_size = c->request_log_size};
    s.api = s.pd ? kvr_sim_api_new(&s.loop, &ac, s.eng, s.neng, s.pd, &s.faults, s.reg) : NULL;
    if (!s.api) {
        KVR_ERROR("msg=\"out of memory at start\"");
        return 1;
    }
    kvr_http_limits lim;
    kvr_http_limits_default(&lim);
    lim.max_body_bytes = c->max_body_bytes;
    lim.close_after_requests = c->close_after_requests;
    s.server = kvr_http_server_new(&s.loop, &lim, kvr_sim_api_handle, s.api);
    int rc = kvr_http_server_listen(s.server, c->host, c->port);
    if (rc >= 0 && c->bootstrap_port) {
        /* SGLang's bootstrap server: the same handler, so /sim/bootstrap/<room> answers on
         * both ports; decodes are told this one */
        s.bootstrap = kvr_http_server_new(&s.loop, &lim, kvr_sim_api_handle, s.api);
        rc = kvr_http_server_listen(s.bootstrap, c->host, c->bootstrap_port);
    }
    int status = 0;
    if (rc < 0) {
        KVR_ERROR("msg=\"cannot listen\" host=%s port=%d error=\"%s\"", c->host,
                  s.bootstrap ? c->bootstrap_port : c->port, uv_strerror(rc));
        status = 1;
        s.stopping = 1;
        uv_signal_init(&s.loop, &s.sigint);
        uv_signal_init(&s.loop, &s.sigterm);
        close_servers(&s);
    } else {
        uv_signal_init(&s.loop, &s.sigint);
        uv_signal_init(&s.loop, &s.sigterm);
        s.sigint.data = s.sigterm.data = &s;
        uv_signal_start(&s.sigint, on_signal, SIGINT);
        uv_signal_start(&s.sigterm, on_signal, SIGTERM);
        kvr_sim_api_set_port(s.api, kvr_http_server_port(s.server));
        kvr_sim_pd_set_port(s.pd, kvr_http_server_port(s.server));
        KVR_INFO("msg=\"kvroute-sim listening\" addr=%s:%d model=\"%s\" kv_blocks=%u "
                 "block_size=%u data_parallel_size=%zu role=%s bootstrap_port=%d "
                 "time_scale=%g profile=%s kv_events=\"%s\"",
                 c->host, kvr_http_server_port(s.server), c->model, c->kv_blocks, c->block_size,
                 s.neng, kvr_sim_role_name((kvr_sim_role)c->role),
                 s.bootstrap ? kvr_http_server_port(s.bootstrap) : 0, c->time_scale,
                 c->profile ? c->profile : "none",
                 c->kv_events_endpoint ? c->kv_events_endpoint : "");
    }
    uv_run(&s.loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&s.loop) != 0)
        KVR_WARN("msg=\"loop closed with handles open\"");
    kvr_sim_api_free(s.api);
    kvr_sim_pd_free(s.pd); /* releases its holds into the pools */
    kvr_sim_engines_free(s.eng, s.neng);
    kvr_metrics_free(s.reg);
    return status;
}
