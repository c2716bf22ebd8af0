/* /status's live figures: a one-second ring (obs/trend.h), recent TTFTs (obs/samples.h),
 * totals and decision counts. */
#include "obs/status_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "obs/samples.h"
#include "obs/trend.h"

struct kvr_status_stats {
    kvr_trend trend;
    kvr_samples *ttft;
    uint64_t start_s;
    uint64_t prompt, cached; /* since start */
    struct {
        char label[48];
        uint64_t count;
    } dec[KVR_STATUS_MAX_DECISIONS];
    size_t ndec;
};

kvr_status_stats *kvr_status_stats_new(size_t ttft_samples, uint64_t now_ms)
{
    kvr_status_stats *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->ttft = kvr_samples_new(ttft_samples ? ttft_samples : 1);
    if (!s->ttft) {
        free(s);
        return NULL;
    }
    s->start_s = now_ms / 1000;
    return s;
}

void kvr_status_stats_free(kvr_status_stats *s)
{
    if (!s)
        return;
    kvr_samples_free(s->ttft);
    free(s);
}

void kvr_status_stats_request(kvr_status_stats *s, uint64_t now_ms, int status)
{
    if (!s)
        return;
    kvr_trend_sums add = {.requests = 1, .errors = status >= 500};
    kvr_trend_add(&s->trend, now_ms / 1000, &add);
}

void kvr_status_stats_tokens(kvr_status_stats *s, uint64_t now_ms, long long prompt,
                             long long cached)
{
    if (!s)
        return;
    kvr_trend_sums add = {.prompt = prompt > 0 ? (uint64_t)prompt : 0,
                          .cached = cached > 0 ? (uint64_t)cached : 0};
    s->prompt += add.prompt;
    s->cached += add.cached;
    kvr_trend_add(&s->trend, now_ms / 1000, &add);
}

void kvr_status_stats_ttft(kvr_status_stats *s, uint64_t now_ms, double ttft_ms)
{
    if (s && ttft_ms >= 0)
        kvr_samples_add(s->ttft, ttft_ms, now_ms);
}

void kvr_status_stats_decision(kvr_status_stats *s, const char *label)
{
    if (!s || !label)
        return;
    for (size_t i = 0; i < s->ndec; i++)
        if (strcmp(s->dec[i].label, label) == 0) {
            s->dec[i].count++;
            return;
        }
    if (s->ndec == KVR_STATUS_MAX_DECISIONS || strlen(label) >= sizeof(s->dec[0].label))
        return;
    strcpy(s->dec[s->ndec].label, label);
    s->dec[s->ndec++].count = 1;
}

/* cached / prompt, or `none` without prompt tokens. */
static json_t *ratio(uint64_t cached, uint64_t prompt, json_t *none)
{
    if (!prompt)
        return none;
    json_decref(none);
    return json_real((double)cached / (double)prompt);
}

void kvr_status_stats_json(const kvr_status_stats *s, uint64_t now_ms, double wall_s,
                           json_t *o)
{
    uint64_t now_s = now_ms / 1000;
    json_object_set_new(o, "hit_rate", ratio(s->cached, s->prompt, json_real(0)));
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)s->prompt));
    json_object_set_new(o, "cached_tokens", json_integer((json_int_t)s->cached));
    json_t *trend = json_array();
    for (int64_t j = 0; j < KVR_STATUS_TREND_POINTS; j++) {
        /* point j: the STEP seconds ending (P - 1 - j) steps before now */
        int64_t to = (int64_t)now_s - (KVR_STATUS_TREND_POINTS - 1 - j) * KVR_STATUS_TREND_STEP_S;
        int64_t from = to - KVR_STATUS_TREND_STEP_S + 1;
        kvr_trend_sums t = {0};
        if (to >= 0)
            t = kvr_trend_range(&s->trend, now_s, from < 0 ? 0 : (uint64_t)from, (uint64_t)to);
        json_array_append_new(
            trend, json_pack("{s:I,s:o,s:I,s:I}", "time",
                             (json_int_t)(floor(wall_s) - (double)((int64_t)now_s - from)),
                             "hit_rate", ratio(t.cached, t.prompt, json_null()),
                             "prompt_tokens", (json_int_t)t.prompt, "cached_tokens",
                             (json_int_t)t.cached));
    }
    json_object_set_new(o, "hit_rate_trend", trend);
    json_t *dec = json_object();
    for (size_t i = 0; i < s->ndec; i++)
        json_object_set_new(dec, s->dec[i].label, json_integer((json_int_t)s->dec[i].count));
    json_object_set_new(o, "decisions", dec);
    uint64_t window = now_s - s->start_s + 1;
    if (window > KVR_STATUS_RATE_WINDOW_S)
        window = KVR_STATUS_RATE_WINDOW_S;
    kvr_trend_sums r = kvr_trend_range(&s->trend, now_s, now_s + 1 - window, now_s);
    json_object_set_new(o, "requests_per_s", json_real((double)r.requests / (double)window));
    json_object_set_new(o, "error_rate",
                        json_real(r.requests ? (double)r.errors / (double)r.requests : 0));
    static const double q[2] = {0.5, 0.99};
    double v[2];
    uint64_t since = now_ms > (uint64_t)KVR_TREND_SPAN_S * 1000
                         ? now_ms - (uint64_t)KVR_TREND_SPAN_S * 1000
                         : 0;
    long n = kvr_samples_quantiles(s->ttft, since, q, v, 2);
    json_object_set_new(o, "ttft_ms",
                        n > 0 ? json_pack("{s:f,s:f,s:I}", "p50", v[0], "p99", v[1],
                                          "samples", (json_int_t)n)
                              : json_pack("{s:n,s:n,s:I}", "p50", "p99", "samples",
                                          (json_int_t)0));
}
