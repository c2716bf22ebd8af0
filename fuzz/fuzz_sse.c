/* libFuzzer harness for the usage reader of worker responses (src/proxy/usage.c): any bytes a
 * worker sends, as a JSON body or as an SSE stream, must never crash, leak or invoke undefined
 * behaviour, whatever the reads' boundaries.
 *
 * Each input runs in six modes (sse 0/1 × want_id 0/1, or as an Anthropic Messages answer
 * with its reply collected for completion teaching) with a memory cap chosen from the input
 * (0 = scanning off, small caps so the overlong-line and overflow paths are reachable, and
 * kvroute's default 1 MiB), fed once whole and once split in chunks: either up to 8 at
 * positions drawn from a hash of the input, or one read per field (a cut before every
 * "data:", as when a worker flushes each event, up to 64). The reader reassembles events
 * split across reads, so both feeds must give the same result: where the socket reads ended
 * must not change what was counted, nor the reply collected.
 *
 * Mode 3 collects a chat reply (completion teaching), the path where token events and plain
 * chat or completions bodies are read in place without a tree (usage.h
 * kvr_usage_tree_only). Every mode is also run with kvr_usage_tree_only set, every event
 * through a jansson tree: the reference. Counts, response id and reply must be the same, but
 * for one case: a JSON body that is no JSON text yet ends in a usage object is counted
 * (usage.c usage_tail()), where the tree reads nothing.
 *
 * Not checked: that token counts are non-negative. usage.h reports the worker's numbers as
 * sent (a negative one included); the metrics layer refuses to decrement a counter
 * (kvr_metric_inc). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/usage.h"
#include "util/json_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t hash(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Feeds `n` bytes split at cuts[0..ncuts) (ascending), then finishes. Mode 2: Messages,
 * mode 3: a chat reply collected. */
static void scan(kvr_usage *u, int sse, size_t cap, int mode, const char *p, size_t n,
                 const size_t *cuts, size_t ncuts)
{
    int want_id = mode == 1;
    kvr_usage_init(u, sse, cap, want_id);
    if (mode == 2) {
        kvr_usage_messages(u);
        kvr_usage_want_reply(u, 4096);
    }
    if (mode == 3)
        kvr_usage_want_reply(u, cap == 16 ? 8 : 4096);
    size_t start = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : n;
        kvr_usage_feed(u, p + start, end - start);
        if (cap && u->buf.len > cap)
            __builtin_trap(); /* the cap bounds what is kept */
        start = end;
    }
    kvr_usage_finish(u);
    if (!u->found && (u->prompt || u->cached || u->completion))
        __builtin_trap();
    if (u->response_id && (!want_id || !u->response_id[0]))
        __builtin_trap();
    if (cap == 0 && (u->found || u->response_id))
        __builtin_trap(); /* cap 0 disables scanning */
}

static int same(const kvr_usage *a, const kvr_usage *b)
{
    if (a->found != b->found || a->prompt != b->prompt || a->cached != b->cached ||
        a->completion != b->completion || a->has_cached != b->has_cached ||
        a->overflow != b->overflow)
        return 0;
    if (!a->response_id || !b->response_id)
        return a->response_id == b->response_id;
    return strcmp(a->response_id, b->response_id) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t caps[] = {0, 16, 64, 256, 1u << 20, 1u << 20, 1u << 20, 1u << 20};
    uint64_t h = hash(data, size);
    size_t cap = caps[h & 7];
    const char *p = (const char *)data;

    size_t cuts[64], ncuts = 0;
    if (h & 8) {
        /* a read per field: cut before every "data:" */
        for (size_t i = 1; i + 5 <= size && ncuts < 64; i++)
            if (memcmp(p + i, "data:", 5) == 0)
                cuts[ncuts++] = i;
    } else {
        /* up to 8 chunks; positions from the rest of the hash, sorted */
        ncuts = (h >> 4) % 8;
        uint64_t x = h;
        for (size_t i = 0; i < ncuts; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            cuts[i] = size ? (size_t)((x >> 33) % (size + 1)) : 0;
            for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                size_t t = cuts[j];
                cuts[j] = cuts[j - 1];
                cuts[j - 1] = t;
            }
        }
    }

    for (int sse = 0; sse <= 1; sse++) {
        for (int mode = 0; mode <= 3; mode++) {
            kvr_usage whole, split, ref;
            scan(&whole, sse, cap, mode, p, size, NULL, 0);
            scan(&split, sse, cap, mode, p, size, cuts, ncuts);
            kvr_usage_tree_only = 1;
            scan(&ref, sse, cap, mode, p, size, cuts, ncuts);
            kvr_usage_tree_only = 0;
            /* usage.c usage_tail(): an answer that is no JSON text but ends in a usage
             * object is counted where the tree counts nothing (not as Messages). */
            int lenient = !sse && mode != 2 && whole.found && !ref.found;
            if (lenient) {
                json_t *j = kvr_json_read(p, size, NULL);
                lenient = j == NULL;
                json_decref(j);
            }
            if (!same(&whole, &split) || (!lenient && !same(&whole, &ref)))
                __builtin_trap();
            json_t *rw = kvr_usage_reply(&whole, 0), *rs = kvr_usage_reply(&split, 0),
                   *rr = kvr_usage_reply(&ref, 0);
            if ((rw == NULL) != (rs == NULL) || (rw && !json_equal(rw, rs)) ||
                (rw == NULL) != (rr == NULL) || (rw && !json_equal(rw, rr)))
                __builtin_trap();
            json_decref(rw);
            json_decref(rs);
            json_decref(rr);
            kvr_usage_free(&whole);
            kvr_usage_free(&split);
            kvr_usage_free(&ref);
        }
    }
    return 0;
}
