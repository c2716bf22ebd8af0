/* Loaders of the request traces: Mooncake (timestamps, lengths, prefix-block ids) and Azure
 * (timestamps and lengths only). One single-turn session per row. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

typedef struct {
    kvr_bench_trace *t;
    size_t max;
    size_t skipped;
    int64_t t0; /* Azure: first row's time, ms */
    bool have_t0;
    bool oom;
} req_ctx;

static int push_blocks(kvr_bench_trace *t, json_t *ids, kvr_bench_turn *turn)
{
    size_t n = json_array_size(ids);
    if (t->nblocks + n > t->blocks_cap) {
        size_t nc = t->blocks_cap ? t->blocks_cap : 4096;
        while (nc < t->nblocks + n)
            nc *= 2;
        uint64_t *nb = realloc(t->blocks, nc * sizeof(*nb));
        if (!nb)
            return -1;
        t->blocks = nb;
        t->blocks_cap = nc;
    }
    turn->block_off = t->nblocks;
    turn->nblocks = (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        t->blocks[t->nblocks++] = (uint64_t)json_integer_value(json_array_get(ids, i));
    return 0;
}

static bool valid_len(json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 &&
           json_integer_value(v) <= (json_int_t)UINT32_MAX;
}

static int mooncake_line(const char *line, size_t n, size_t lineno, void *ud)
{
    req_ctx *c = ud;
    if (c->max && c->t->nturns >= c->max)
        return 1;
    json_t *row = json_loadb(line, n, 0, NULL);
    json_t *ts = json_object_get(row, "timestamp"), *in = json_object_get(row, "input_length"),
           *out = json_object_get(row, "output_length"), *ids = json_object_get(row, "hash_ids");
    bool ok = json_is_number(ts) && valid_len(in) && valid_len(out) && json_is_array(ids);
    for (size_t i = 0; ok && i < json_array_size(ids); i++)
        ok = json_is_integer(json_array_get(ids, i)) &&
             json_integer_value(json_array_get(ids, i)) >= 0;
    if (!ok) {
        fprintf(stderr, "kvroute-bench: Mooncake line %zu: unexpected shape, skipped\n", lineno);
        c->skipped++;
        json_decref(row);
        return 0;
    }
    char name[48];
    snprintf(name, sizeof(name), "mooncake-%zu", lineno);
    kvr_bench_session *s = kvr_bench_trace_add_session(c->t, name);
    kvr_bench_turn *turn = s ? kvr_bench_session_add_turn(c->t, s) : NULL;
    if (!turn || push_blocks(c->t, ids, turn) < 0) {
        c->oom = true;
        json_decref(row);
        return -1;
    }
    turn->input_tokens = (uint32_t)json_integer_value(in);
    turn->answer_tokens = (uint32_t)json_integer_value(out);
    turn->at_ms = (int64_t)json_number_value(ts);
    json_decref(row);
    return 0;
}

int kvr_bench_load_mooncake(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen)
{
    (void)dir;
    req_ctx c = {.t = t, .max = max};
    t->has_timestamps = true;
    if (kvr_bench_each_line(text, len, mooncake_line, &c) < 0 || c.oom) {
        snprintf(err, errlen, "Mooncake: out of memory");
        return -1;
    }
    return 0;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* "YYYY-MM-DD HH:MM:SS[.fraction]" → ms since the epoch (the trace has no zone; only
 * differences are used). Returns 0 or -1. */
static int parse_stamp(const char *s, size_t n, int64_t *ms)
{
    char tmp[64];
    if (n >= sizeof(tmp))
        return -1;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    int y, mo, d, h, mi, sec, used = 0;
    if (sscanf(tmp, "%d-%d-%d %d:%d:%d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 || mo < 1 ||
        mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 60)
        return -1;
    double frac = 0, scale = 0.1;
    const char *p = tmp + used;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    if (*p)
        return -1;
    int64_t days = days_from_civil(y, (unsigned)mo, (unsigned)d);
    *ms = ((days * 24 + h) * 60 + mi) * 60000 + (int64_t)sec * 1000 + (int64_t)(frac * 1000);
    return 0;
}

static int azure_line(const char *line, size_t n, size_t lineno, void *ud)
{
    req_ctx *c = ud;
    if (c->max && c->t->nturns >= c->max)
        return 1;
    const char *c1 = memchr(line, ',', n);
    const char *c2 = c1 ? memchr(c1 + 1, ',', (size_t)(line + n - c1 - 1)) : NULL;
    int64_t ms = 0;
    char nums[64];
    long long in = -1, out = -1;
    if (c1 && c2 && parse_stamp(line, (size_t)(c1 - line), &ms) == 0 &&
        (size_t)(line + n - c1) < sizeof(nums)) {
        memcpy(nums, c1 + 1, (size_t)(line + n - c1 - 1));
        nums[line + n - c1 - 1] = '\0';
        char extra;
        if (sscanf(nums, "%lld,%lld%c", &in, &out, &extra) != 2)
            in = -1;
    }
    if (in < 0 || out < 0 || in > UINT32_MAX || out > UINT32_MAX) {
        if (lineno != 1) /* the header */
            fprintf(stderr, "kvroute-bench: Azure line %zu: unexpected shape, skipped\n", lineno);
        c->skipped++;
        return 0;
    }
    if (!c->have_t0) {
        c->t0 = ms;
        c->have_t0 = true;
    }
    char name[48];
    snprintf(name, sizeof(name), "azure-%zu", lineno);
    kvr_bench_session *s = kvr_bench_trace_add_session(c->t, name);
    kvr_bench_turn *turn = s ? kvr_bench_session_add_turn(c->t, s) : NULL;
    if (!turn) {
        c->oom = true;
        return -1;
    }
    turn->input_tokens = (uint32_t)in;
    turn->answer_tokens = (uint32_t)out;
    turn->at_ms = ms - c->t0 < 0 ? 0 : ms - c->t0;
    return 0;
}

int kvr_bench_load_azure(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                         size_t max, char *err, size_t errlen)
{
    (void)dir;
    req_ctx c = {.t = t, .max = max};
    t->has_timestamps = true;
    if (kvr_bench_each_line(text, len, azure_line, &c) < 0 || c.oom) {
        snprintf(err, errlen, "Azure: out of memory");
        return -1;
    }
    return 0;
}
