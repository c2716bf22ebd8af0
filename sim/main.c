/* kvroute-sim: command-line flags → kvr_sim_config → kvr_sim_run(). Flags are a table of
 * name, type, bounds and target field; `--name value` and `--name=value` both work.
 * `--profile NAME` (profile.h) sets a group of defaults; every other flag given overrides
 * them wherever it stands on the command line: argv is parsed once to learn the profile, then
 * again over the profile's values. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "pd.h"
#include "profile.h"
#include "sim.h"
#include "util/flags.h"
#include "util/log.h"

static int log_level = KVR_LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

/* Enum-like flags: each value names one constant; the usage shows the default by name. */
static int set_format(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)err, (void)cap;
    if (strcmp(v, "array") && strcmp(v, "map"))
        return -1;
    *(int *)((char *)t + f->off) = strcmp(v, "map") == 0;
    return 0;
}

static void show_format(FILE *out, const void *t, const kvr_flag *f)
{
    fputs(*(const int *)((const char *)t + f->off) ? "map" : "array", out);
}

static const char *const bind_names[] = {
    [KVR_SIM_EV_AUTO] = "auto", [KVR_SIM_EV_BIND] = "bind", [KVR_SIM_EV_CONNECT] = "connect"};

static int set_bind(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)err, (void)cap;
    for (size_t i = 0; i < sizeof(bind_names) / sizeof(*bind_names); i++)
        if (bind_names[i] && strcmp(v, bind_names[i]) == 0) {
            *(kvr_sim_ev_bind *)((char *)t + f->off) = (kvr_sim_ev_bind)i;
            return 0;
        }
    return -1;
}

static void show_bind(FILE *out, const void *t, const kvr_flag *f)
{
    fputs(bind_names[*(const kvr_sim_ev_bind *)((const char *)t + f->off)], out);
}

static int set_dp_events(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)err, (void)cap;
    if (strcmp(v, "per-rank") && strcmp(v, "shared"))
        return -1;
    *(int *)((char *)t + f->off) = strcmp(v, "shared") == 0;
    return 0;
}

static void show_dp_events(FILE *out, const void *t, const kvr_flag *f)
{
    fputs(*(const int *)((const char *)t + f->off) ? "shared" : "per-rank", out);
}

static int set_role(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)err, (void)cap;
    for (int r = KVR_SIM_ROLE_BOTH; r <= KVR_SIM_ROLE_DECODE; r++)
        if (strcmp(v, kvr_sim_role_name((kvr_sim_role)r)) == 0) {
            *(int *)((char *)t + f->off) = r;
            return 0;
        }
    return -1;
}

static void show_role(FILE *out, const void *t, const kvr_flag *f)
{
    fputs(kvr_sim_role_name((kvr_sim_role) * (const int *)((const char *)t + f->off)), out);
}

/* The log level is process state, not part of kvr_sim_config: it lives in `log_level`. */
static int set_level(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)t, (void)f, (void)err, (void)cap;
    int l = kvr_log_parse_level(v);
    if (l < 0)
        return -1;
    log_level = l;
    return 0;
}

static void show_level(FILE *out, const void *t, const kvr_flag *f)
{
    (void)t, (void)f;
    fputs(level_names[log_level], out);
}

/* `--profile`: only checks and records the name; main() applies the profile before the flags
 * that override it. */
static int set_profile(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    const kvr_sim_profile *p = kvr_sim_profile_find(v);
    if (!p) {
        int n = snprintf(err, cap, "--profile: unknown profile '%.100s' (known:", v);
        for (size_t i = 0; i < kvr_sim_profile_count() && n > 0 && (size_t)n < cap; i++)
            n += snprintf(err + n, cap - (size_t)n, " %s", kvr_sim_profile_at(i)->name);
        if (n > 0 && (size_t)n < cap)
            snprintf(err + n, cap - (size_t)n, ")");
        return -1;
    }
    *(const char **)((char *)t + f->off) = p->name;
    return 0;
}

static void show_profile(FILE *out, const void *t, const kvr_flag *f)
{
    const char *name = *(const char *const *)((const char *)t + f->off);
    fputs(name ? name : "none", out);
}

#define F(n, t, field, lo, hi, h)                                                         \
    {.name = n, .type = KVR_FLAG_##t, .off = offsetof(kvr_sim_config, field), .min = lo,     \
     .max = hi, .help = h}
#define C(n, field, setf, showf, h)                                                          \
    {.name = n, .type = KVR_FLAG_CUSTOM, .off = offsetof(kvr_sim_config, field), .help = h, \
     .set = setf, .show = showf}

static const kvr_flag flags[] = {
    C("profile", profile, set_profile, show_profile,
      "timing profile (listed below); other flags override its values"),
    F("host", STR, host, 0, 0, "HTTP bind address"),
    F("port", INT, port, 0, 65535, "HTTP port (0 = ephemeral)"),
    F("model", STR, model, 0, 0, "served model name"),
    F("kv-blocks", U32, kv_blocks, 1, 1e8, "KV cache capacity in blocks"),
    F("block-size", U32, block_size, 1, 1024, "tokens per KV block"),
    F("max-num-seqs", U32, max_num_seqs, 1, 65536, "running sequences at most"),
    F("max-num-batched-tokens", U32, max_num_batched_tokens, 1, 1e7, "tokens per step"),
    F("max-model-len", U32, max_model_len, 2, 1e8, "prompt + output tokens at most"),
    F("default-max-tokens", U32, default_max_tokens, 1, 1e8, "output tokens when unset"),
    F("prefill-us-per-token", DOUBLE, prefill_us_per_token, 0, 1e9, "model µs per prefill token"),
    F("decode-us-per-token", DOUBLE, decode_us_per_token, 0, 1e9,
      "model µs per decoding sequence per step"),
    F("step-overhead-us", DOUBLE, step_overhead_us, 0, 1e9, "model µs per step"),
    F("decode-us-per-kv-token", DOUBLE, decode_us_per_kv_token, 0, 1e6,
      "model µs per context token of a decoding sequence (KV read)"),
    F("time-scale", DOUBLE, time_scale, 0, 1e6, "wall time per model time (0 = never sleep)"),
    F("kv-events-endpoint", STR, kv_events_endpoint, 0, 0, "ZMQ PUB endpoint (off if unset)"),
    F("kv-events-replay-endpoint", STR, kv_events_replay_endpoint, 0, 0,
      "ZMQ ROUTER replay endpoint (bound)"),
    C("kv-events-format", kv_events_map, set_format, show_format, "array | map"),
    F("kv-events-topic", STR, kv_events_topic, 0, 0, "topic frame (default empty)"),
    C("kv-events-bind", kv_events_bind, set_bind, show_bind,
      "auto (vLLM: bind if the endpoint has * or ::, or is ipc/inproc) | bind | connect"),
    F("kv-events-hwm", INT, kv_events_hwm, 0, 1e9, "PUB high-water mark, messages"),
    F("kv-events-buffer-steps", SIZE, kv_events_buffer_steps, 0, 1e8,
      "batches kept for replay"),
    F("kv-events-buffer-bytes", SIZE, kv_events_buffer_bytes, 0, 1e12,
      "payload bytes kept for replay"),
    F("kv-events-max-batch-bytes", SIZE, kv_events_max_batch_bytes, 64, 1e10,
      "cap on one batch of events"),
    F("data-parallel-size", U32, data_parallel_size, 1, 256,
      "engine ranks behind the one port, each with its own --kv-blocks cache and scheduler; "
      "X-data-parallel-rank picks one (round robin without it)"),
    C("kv-events-dp", kv_events_dp_shared, set_dp_events, show_dp_events,
      "with --data-parallel-size > 1: per-rank (vLLM: rank r publishes on the endpoint's "
      "port + r) | shared (all ranks on the one endpoint)"),
    C("role", role, set_role, show_role,
      "prefill | decode | both: the part played in a disaggregated pair (docs/sim.md)"),
    F("kv-hold-ms", U64, kv_hold_ms, 1, 864e5,
      "a prefill holds a request's KV blocks for its decode this long at most"),
    F("kv-hold-max-requests", SIZE, kv_hold_max_requests, 1, 1e7,
      "requests whose KV a prefill holds at most (the oldest hold ends first)"),
    F("kv-transfer-us-per-block", DOUBLE, kv_transfer_us_per_block, 0, 1e9,
      "model µs a decode spends fetching one block"),
    F("kv-transfer-timeout-ms", U64, kv_transfer_timeout_ms, 1, 864e5,
      "a decode's KV fetch gives up (and recomputes) after this long, waiting included"),
    F("bootstrap-port", INT, bootstrap_port, 0, 65535,
      "SGLang bootstrap server port on --host (0 = none)"),
    F("request-log-size", SIZE, request_log_size, 0, 1e7,
      "generation requests GET /sim/requests keeps (0 = none)"),
    F("seed", U64, seed, 0, 1.8e19, "seed of faults, output text and hashes"),
    F("max-waiting", SIZE, max_waiting, 1, 1e9, "queued requests before 503"),
    F("max-body-bytes", SIZE, max_body_bytes, 1024, 1e10, "request body cap"),
    F("close-after-requests", U64, close_after_requests, 0, 1e12,
      "close each keep-alive connection after N responses without announcing it, as a worker "
      "whose keep-alive timeout fires just as a response ends (0 = never)"),
    F("detokenize-cache-entries", SIZE, detokenize_cache_entries, 0, 1 << 24,
      "prompt pieces remembered so /detokenize can print them (0 = none)"),
    F("max-stored-responses", SIZE, max_stored_responses, 0, 1e7,
      "/v1/responses kept for previous_response_id (oldest dropped)"),
    F("fail-rate", DOUBLE, faults.fail_rate, 0, 1, "probability a completion request fails"),
    F("fail-status", INT, faults.fail_status, 100, 599, "status of injected failures"),
    F("delay-ms", U64, faults.delay_ms, 0, 86400000, "delay before response headers"),
    F("stall-after-events", LONG, faults.stall_after_events, -1, 1e9,
      "stop writing after N SSE events (-1 off)"),
    F("drop-after-events", LONG, faults.drop_after_events, -1, 1e9,
      "close the connection after N SSE events (-1 off)"),
    F("health-status", INT, faults.health_status, 100, 599, "status of GET /health"),
    F("drop-event-batches", LONG, faults.drop_event_batches, 0, 1e9,
      "withhold the next N KV-event batches from PUB (still numbered and replayable)"),
    F("replay-silent", BOOL, faults.replay_silent, 0, 1, "ignore KV-event replay requests"),
    F("kv-params-drop-rate", DOUBLE, faults.kv_params_drop_rate, 0, 1,
      "probability a prefill answers without kv_transfer_params (and holds nothing)"),
    F("kv-transfer-fail-rate", DOUBLE, faults.kv_transfer_fail_rate, 0, 1,
      "probability a KV transfer fails (decode: not sent; prefill: answered 500)"),
    {.name = "log-level", .type = KVR_FLAG_CUSTOM, .help = "debug | info | warn | error",
     .set = set_level, .show = show_level},
};

#define NFLAGS (sizeof(flags) / sizeof(*flags))

static void usage(FILE *f, const kvr_sim_config *defaults)
{
    fprintf(f, "usage: kvroute-sim [--flag value]...\nA simulated vLLM worker (docs/sim.md).\n\n"
               "flags (default in brackets):\n");
    kvr_flags_usage(f, flags, NFLAGS, defaults, 28);
    fprintf(f, "\nprofiles (--profile NAME; model time, docs/sim.md):\n");
    for (size_t i = 0; i < kvr_sim_profile_count(); i++) {
        const kvr_sim_profile *p = kvr_sim_profile_at(i);
        fprintf(f, "  %-22s %s\n  %-22s model %s, %u KV blocks, max_num_seqs %u, "
                   "max_num_batched_tokens %u,\n  %-22s step %g us + %g us/prefill token + "
                   "%g us/decoding seq + %g us/KV token\n",
                p->name, p->summary, "", p->model, p->kv_blocks, p->max_num_seqs,
                p->max_num_batched_tokens, "", p->timing.step_overhead_us,
                p->timing.prefill_us_per_token, p->timing.decode_us_per_token,
                p->timing.decode_us_per_kv_token);
    }
}

int main(int argc, char **argv)
{
    kvr_sim_config c;
    kvr_sim_config_default(&c);
    char err[512];
    int rc = kvr_flags_parse(flags, NFLAGS, &c, argc, argv, err, sizeof(err));
    if (rc == 0 && c.profile) {
        /* Again over the profile's values, so the flags given override them. */
        const char *profile = c.profile;
        kvr_sim_config_default(&c);
        kvr_sim_config_apply_profile(&c, profile);
        rc = kvr_flags_parse(flags, NFLAGS, &c, argc, argv, err, sizeof(err));
    }
    if (rc == 1) {
        kvr_sim_config_default(&c); /* show defaults, not flags given before --help */
        log_level = KVR_LOG_INFO;
        usage(stdout, &c);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "kvroute-sim: %s\n", err);
        return 2;
    }
    if (c.max_model_len < 2 || !c.model || !*c.model) {
        fprintf(stderr, "kvroute-sim: --model must not be empty\n");
        return 2;
    }
    kvr_log_set_level((kvr_log_level)log_level);
    return kvr_sim_run(&c);
}
