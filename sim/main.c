/* kvroute-sim: command-line flags → kvr_sim_config → kvr_sim_run(). Flags are a table of
 * name, type, bounds and target field; `--name value` and `--name=value` both work. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "util/log.h"

typedef enum { T_STR, T_INT, T_U32, T_U64, T_SIZE, T_DBL, T_LONG, T_FORMAT, T_BIND, T_LEVEL } ftype;

typedef struct flag {
    const char *name;
    ftype type;
    size_t off;
    double lo, hi;
    const char *help;
} flag;

#define F(n, t, field, lo, hi, help) {n, t, offsetof(kvr_sim_config, field), lo, hi, help}

static int log_level = KVR_LOG_INFO;

static const flag flags[] = {
    F("host", T_STR, host, 0, 0, "HTTP bind address"),
    F("port", T_INT, port, 0, 65535, "HTTP port (0 = ephemeral)"),
    F("model", T_STR, model, 0, 0, "served model name"),
    F("kv-blocks", T_U32, kv_blocks, 1, 1e8, "KV cache capacity in blocks"),
    F("block-size", T_U32, block_size, 1, 1024, "tokens per KV block"),
    F("max-num-seqs", T_U32, max_num_seqs, 1, 65536, "running sequences at most"),
    F("max-num-batched-tokens", T_U32, max_num_batched_tokens, 1, 1e7, "tokens per step"),
    F("max-model-len", T_U32, max_model_len, 2, 1e8, "prompt + output tokens at most"),
    F("default-max-tokens", T_U32, default_max_tokens, 1, 1e8, "output tokens when unset"),
    F("prefill-us-per-token", T_DBL, prefill_us_per_token, 0, 1e9, "model µs per prefill token"),
    F("decode-us-per-token", T_DBL, decode_us_per_token, 0, 1e9,
      "model µs per decoding sequence per step"),
    F("step-overhead-us", T_DBL, step_overhead_us, 0, 1e9, "model µs per step"),
    F("time-scale", T_DBL, time_scale, 0, 1e6, "wall time per model time (0 = never sleep)"),
    F("kv-events-endpoint", T_STR, kv_events_endpoint, 0, 0, "ZMQ PUB endpoint (off if unset)"),
    F("kv-events-replay-endpoint", T_STR, kv_events_replay_endpoint, 0, 0,
      "ZMQ ROUTER replay endpoint (bound)"),
    F("kv-events-format", T_FORMAT, kv_events_map, 0, 0, "array | map"),
    F("kv-events-topic", T_STR, kv_events_topic, 0, 0, "topic frame (default empty)"),
    F("kv-events-bind", T_BIND, kv_events_bind, 0, 0,
      "auto (vLLM: bind if the endpoint has * or ::, or is ipc/inproc) | bind | connect"),
    F("kv-events-hwm", T_INT, kv_events_hwm, 0, 1e9, "PUB high-water mark, messages"),
    F("kv-events-buffer-steps", T_SIZE, kv_events_buffer_steps, 0, 1e8,
      "batches kept for replay"),
    F("kv-events-buffer-bytes", T_SIZE, kv_events_buffer_bytes, 0, 1e12,
      "payload bytes kept for replay"),
    F("kv-events-max-batch-bytes", T_SIZE, kv_events_max_batch_bytes, 64, 1e10,
      "cap on one batch of events"),
    F("seed", T_U64, seed, 0, 1.8e19, "seed of faults, output text and hashes"),
    F("max-waiting", T_SIZE, max_waiting, 1, 1e9, "queued requests before 503"),
    F("max-body-bytes", T_SIZE, max_body_bytes, 1024, 1e10, "request body cap"),
    F("fail-rate", T_DBL, faults.fail_rate, 0, 1, "probability a completion request fails"),
    F("fail-status", T_INT, faults.fail_status, 100, 599, "status of injected failures"),
    F("delay-ms", T_U64, faults.delay_ms, 0, 86400000, "delay before response headers"),
    F("stall-after-events", T_LONG, faults.stall_after_events, -1, 1e9,
      "stop writing after N SSE events (-1 off)"),
    F("drop-after-events", T_LONG, faults.drop_after_events, -1, 1e9,
      "close the connection after N SSE events (-1 off)"),
    F("health-status", T_INT, faults.health_status, 100, 599, "status of GET /health"),
    {"log-level", T_LEVEL, 0, 0, 0, "debug | info | warn | error"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvroute-sim [--flag value]...\nA simulated vLLM worker (docs/sim.md).\n\n");
    for (size_t i = 0; i < sizeof(flags) / sizeof(*flags); i++)
        fprintf(f, "  --%-28s %s\n", flags[i].name, flags[i].help);
}

static int set_flag(kvr_sim_config *c, const flag *fl, const char *v)
{
    char *p = (char *)c + fl->off;
    char *end = NULL;
    errno = 0;
    switch (fl->type) {
    case T_STR:
        *(const char **)p = v;
        return 0;
    case T_FORMAT:
        if (strcmp(v, "array") && strcmp(v, "map"))
            return -1;
        *(int *)p = strcmp(v, "map") == 0;
        return 0;
    case T_BIND:
        if (strcmp(v, "auto") == 0)
            *(kvr_sim_ev_bind *)p = KVR_SIM_EV_AUTO;
        else if (strcmp(v, "bind") == 0)
            *(kvr_sim_ev_bind *)p = KVR_SIM_EV_BIND;
        else if (strcmp(v, "connect") == 0)
            *(kvr_sim_ev_bind *)p = KVR_SIM_EV_CONNECT;
        else
            return -1;
        return 0;
    case T_LEVEL:
        log_level = kvr_log_parse_level(v);
        return log_level < 0 ? -1 : 0;
    default:
        break;
    }
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d < fl->lo || d > fl->hi)
        return -1;
    int integral = fl->type != T_DBL;
    if (integral && d != floor(d))
        return -1;
    switch (fl->type) {
    case T_INT:
        *(int *)p = (int)d;
        break;
    case T_U32:
        *(uint32_t *)p = (uint32_t)d;
        break;
    case T_U64:
        /* plain digits are read exactly (a double rounds seeds above 2^53) */
        *(uint64_t *)p = strspn(v, "0123456789") == strlen(v) ? strtoull(v, NULL, 10)
                                                                : (uint64_t)d;
        break;
    case T_SIZE:
        *(size_t *)p = (size_t)d;
        break;
    case T_LONG:
        *(long *)p = (long)d;
        break;
    default:
        *(double *)p = d;
        break;
    }
    return 0;
}

int main(int argc, char **argv)
{
    kvr_sim_config c;
    kvr_sim_config_default(&c);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvroute-sim: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const flag *fl = NULL;
        for (size_t k = 0; k < sizeof(flags) / sizeof(*flags); k++)
            if (strlen(flags[k].name) == nlen && strncmp(flags[k].name, a, nlen) == 0)
                fl = &flags[k];
        if (!fl) {
            fprintf(stderr, "kvroute-sim: unknown flag --%.*s\n", (int)nlen, a);
            usage(stderr);
            return 2;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v || set_flag(&c, fl, v) < 0) {
            fprintf(stderr, "kvroute-sim: bad value for --%s: '%s' (%s)\n", fl->name,
                    v ? v : "", fl->help);
            return 2;
        }
    }
    if (c.max_model_len < 2 || !c.model || !*c.model) {
        fprintf(stderr, "kvroute-sim: --model must not be empty\n");
        return 2;
    }
    kvr_log_set_level((kvr_log_level)log_level);
    return kvr_sim_run(&c);
}
