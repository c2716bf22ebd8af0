/* Per-worker GET probes over kvr_fetch. */
#include "workers/probe.h"

#include <stdlib.h>

#include "workers/fetch.h"

typedef struct probe {
    kvr_workers_ctx *ctx;
    size_t worker_id;
    kvr_probe_cb cb;
} probe;

static void on_fetched(void *ud, int status, const char *body, size_t len, int truncated,
                       kvr_upstream_err err)
{
    (void)truncated;
    probe *pr = ud;
    pr->cb(pr->ctx, kvr_registry_get(pr->ctx->reg, pr->worker_id), status, body, len, err);
    free(pr);
}

int kvr_probe_worker(kvr_workers_ctx *ctx, kvr_worker *w, const char *path, size_t max_bytes,
                     uint64_t timeout_ms, kvr_probe_cb cb)
{
    char url[2048];
    probe *pr = malloc(sizeof(*pr));
    if (!pr || kvr_worker_url(w, path, url, sizeof(url)) < 0) {
        free(pr);
        return -1;
    }
    *pr = (probe){ctx, w->id, cb};
    if (kvr_fetch(ctx->loop, ctx->up, url, w->api_key, max_bytes, timeout_ms, on_fetched, pr) < 0) {
        free(pr);
        return -1;
    }
    return 0;
}
