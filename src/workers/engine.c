/* Data-parallel engines: spreading engine-wide results over the ranks (see engine.h). */
#include "workers/engine.h"

size_t kvr_engine_ranks(const kvr_workers_ctx *ctx, kvr_worker *engine, kvr_worker **out)
{
    out[0] = engine;
    size_t n = kvr_registry_ranks(ctx->reg, engine, out + 1, KVR_ENGINE_MAX_RANKS - 1);
    return 1 + (n < KVR_ENGINE_MAX_RANKS - 1 ? n : KVR_ENGINE_MAX_RANKS - 1);
}

void kvr_engine_forget(kvr_workers_ctx *ctx, kvr_worker *engine)
{
    if (!ctx->on_forget)
        return;
    kvr_worker *ranks[KVR_ENGINE_MAX_RANKS];
    size_t n = kvr_engine_ranks(ctx, engine, ranks);
    for (size_t i = 0; i < n; i++)
        ctx->on_forget(ctx->ud, ranks[i]);
}
