/* The live figures behind the admin GET /status (docs/metrics.md "Status"): requests and
 * errors per second, the fleet's prompt-cache hit rate and its 15-minute trend, TTFT
 * quantiles and decision counts. Fed by the proxy where the matching Prometheus metrics are
 * counted, so both views agree; loop thread only. */
#ifndef KVR_OBS_STATUS_STATS_H
#define KVR_OBS_STATUS_STATS_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/** The figures (opaque). */
typedef struct kvr_status_stats kvr_status_stats;

/** Seconds behind requests_per_s and error_rate. */
#define KVR_STATUS_RATE_WINDOW_S 60
/** Points of hit_rate_trend, and seconds per point (together the last 15 minutes). */
#define KVR_STATUS_TREND_POINTS 30
#define KVR_STATUS_TREND_STEP_S 30
/** Distinct decision labels kept (the policies have fewer; more are not counted). */
#define KVR_STATUS_MAX_DECISIONS 64

/** New figures starting at `now_ms` (monotonic ms), keeping the last `ttft_samples` (>= 1)
 *  TTFTs; NULL when out of memory. Free with kvr_status_stats_free. */
kvr_status_stats *kvr_status_stats_new(size_t ttft_samples, uint64_t now_ms);
/** Frees `s` (NULL is fine). */
void kvr_status_stats_free(kvr_status_stats *s);

/** An API request finished with `status` (>= 500 counts as an error). */
void kvr_status_stats_request(kvr_status_stats *s, uint64_t now_ms, int status);
/** A response's usage: `prompt` tokens of which `cached` came from a prefix cache (negative
 *  values count as 0). */
void kvr_status_stats_tokens(kvr_status_stats *s, uint64_t now_ms, long long prompt,
                             long long cached);
/** A time to first byte, in ms. */
void kvr_status_stats_ttft(kvr_status_stats *s, uint64_t now_ms, double ttft_ms);
/** A request's final decision label (borrowed; copied when first seen, up to 47 bytes). */
void kvr_status_stats_decision(kvr_status_stats *s, const char *label);

/** Adds the fleet figures to object `o` as of `now_ms`, `wall_s` being the Unix time now:
 *  hit_rate (cached/prompt since start, 0 without tokens), prompt_tokens, cached_tokens,
 *  hit_rate_trend (KVR_STATUS_TREND_POINTS objects {time, hit_rate (null without tokens),
 *  prompt_tokens, cached_tokens}, oldest first, `time` the Unix second a point starts),
 *  decisions {label: count}, requests_per_s and error_rate (over the last
 *  KVR_STATUS_RATE_WINDOW_S seconds, or since start when sooner), ttft_ms {p50, p99, samples}
 *  (over the last TTFT samples of the last 15 minutes; p50 and p99 null when none). */
void kvr_status_stats_json(const kvr_status_stats *s, uint64_t now_ms, double wall_s,
                           json_t *o);

#endif
