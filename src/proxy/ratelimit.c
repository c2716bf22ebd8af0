/* Per-key rate limits (see ratelimit.h). */
#include "proxy/ratelimit.h"

#include <stdlib.h>
#include <string.h>

#define SLOTS 60

typedef struct limit {
    char *key;
    uint64_t rpm, tpm;
    uint64_t sec[SLOTS];
    uint64_t req[SLOTS];
    int64_t tok[SLOTS];
} limit;

struct kvr_ratelimits {
    limit *l;
    size_t n;
};

kvr_ratelimits *kvr_ratelimits_new(const kvr_rate_limit_spec *specs, size_t n)
{
    kvr_ratelimits *rl = calloc(1, sizeof(*rl));
    if (!rl || !(rl->l = calloc(n ? n : 1, sizeof(*rl->l))))
        abort();
    for (size_t i = 0; i < n; i++) {
        if (!(rl->l[i].key = strdup(specs[i].key)))
            abort();
        rl->l[i].rpm = specs[i].requests_per_minute;
        rl->l[i].tpm = specs[i].tokens_per_minute;
    }
    rl->n = n;
    return rl;
}

void kvr_ratelimits_free(kvr_ratelimits *rl)
{
    if (!rl)
        return;
    for (size_t i = 0; i < rl->n; i++)
        free(rl->l[i].key);
    free(rl->l);
    free(rl);
}

static limit *find(kvr_ratelimits *rl, const char *key)
{
    for (size_t i = 0; key && i < rl->n; i++)
        if (strcmp(rl->l[i].key, key) == 0)
            return &rl->l[i];
    return NULL;
}

static size_t slot(limit *l, uint64_t now_s)
{
    size_t i = (size_t)(now_s % SLOTS);
    if (l->sec[i] != now_s) {
        l->sec[i] = now_s;
        l->req[i] = 0;
        l->tok[i] = 0;
    }
    return i;
}

/* Totals over the window, and the seconds until the oldest non-empty slot leaves it. */
static void window(const limit *l, uint64_t now_s, uint64_t *req, int64_t *tok,
                   uint64_t *req_reset, uint64_t *tok_reset)
{
    *req = 0;
    *tok = 0;
    *req_reset = *tok_reset = 0;
    uint64_t oldest_r = now_s + 1, oldest_t = now_s + 1;
    for (size_t i = 0; i < SLOTS; i++) {
        if (l->sec[i] + SLOTS <= now_s)
            continue;
        *req += l->req[i];
        *tok += l->tok[i];
        if (l->req[i] && l->sec[i] < oldest_r)
            oldest_r = l->sec[i];
        if (l->tok[i] > 0 && l->sec[i] < oldest_t)
            oldest_t = l->sec[i];
    }
    if (oldest_r <= now_s)
        *req_reset = oldest_r + SLOTS - now_s;
    if (oldest_t <= now_s)
        *tok_reset = oldest_t + SLOTS - now_s;
}

int kvr_ratelimit_take(kvr_ratelimits *rl, const char *key, uint64_t tokens, uint64_t now_ms,
                       kvr_ratelimit_info *info)
{
    memset(info, 0, sizeof(*info));
    limit *l = find(rl, key);
    if (!l || (!l->rpm && !l->tpm))
        return 0;
    uint64_t now_s = now_ms / 1000, req, rr, tr;
    int64_t tok;
    size_t cur = slot(l, now_s);
    window(l, now_s, &req, &tok, &rr, &tr);
    uint64_t used_tok = tok > 0 ? (uint64_t)tok : 0;
    int over_req = l->rpm && req + 1 > l->rpm;
    /* A request larger than the whole budget would never fit: it passes on an empty window
     * rather than being refused forever. */
    int over_tok = l->tpm && used_tok + tokens > l->tpm && used_tok > 0;
    info->limited = 1;
    info->limit_requests = l->rpm;
    info->limit_tokens = l->tpm;
    info->reset_requests_s = rr;
    info->reset_tokens_s = tr;
    if (over_req || over_tok) {
        info->remaining_requests = l->rpm > req ? l->rpm - req : 0;
        info->remaining_tokens = l->tpm > used_tok ? l->tpm - used_tok : 0;
        uint64_t wait = over_req ? rr : 0;
        if (over_tok && tr > wait)
            wait = tr;
        info->retry_after_s = wait ? wait : 1;
        return 1;
    }
    l->req[cur]++;
    l->tok[cur] += (int64_t)tokens;
    req++;
    used_tok += tokens;
    if (!info->reset_requests_s)
        info->reset_requests_s = SLOTS;
    if (!info->reset_tokens_s && tokens)
        info->reset_tokens_s = SLOTS;
    info->remaining_requests = l->rpm > req ? l->rpm - req : 0;
    info->remaining_tokens = l->tpm > used_tok ? l->tpm - used_tok : 0;
    return 0;
}

void kvr_ratelimit_settle(kvr_ratelimits *rl, const char *key, int64_t delta, uint64_t now_ms)
{
    limit *l = find(rl, key);
    if (l)
        l->tok[slot(l, now_ms / 1000)] += delta;
}
