/* Deterministic synthetic prompt text for traces that carry no text: Mooncake's prefix-block ids
 * and Azure's bare token counts. */
#ifndef KVR_BENCH_SYNTH_H
#define KVR_BENCH_SYNTH_H
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

/** Tokens per Mooncake hash-id block (Mooncake FAST'25 trace README: 512-token blocks). */
#define KVR_BENCH_MOONCAKE_BLOCK_TOKENS 512
/** Bytes per pseudo-token: three lowercase letters and a space. Four bytes is the usual
 *  bytes-per-token estimate (and kvroute's 64-byte ≈ 16-token index block), and one word per
 *  token also holds for whitespace or regex tokenizers, so "N pseudo-tokens" is N tokens to any
 *  plausible engine tokenizer. */
#define KVR_BENCH_PSEUDO_TOKEN_BYTES 4

/** Appends the first `ntokens` pseudo-tokens (≤ KVR_BENCH_MOONCAKE_BLOCK_TOKENS) of the text of
 *  Mooncake block `id` to `out`. A pure function of (seed, id): the same id always gives the same
 *  bytes, so blocks the trace shares are shared bytes in the prompts. Returns 0, or -1 when
 *  `out` is full. */
int kvr_bench_block_text(uint64_t seed, uint64_t id, size_t ntokens, kvr_buf *out);

/** Appends `ntokens` pseudo-tokens of text unique to (seed, stream) — Azure's prompts, which
 *  must share nothing. Returns 0, or -1 when `out` is full. */
int kvr_bench_random_text(uint64_t seed, uint64_t stream, size_t ntokens, kvr_buf *out);

/** Appends the prompt of a Mooncake request: its blocks' texts concatenated and cut to
 *  `input_tokens` pseudo-tokens (blocks beyond the cut are not used; missing blocks, if the
 *  row is short, are never invented — the prompt is then shorter). Returns 0 or -1 (full). */
int kvr_bench_mooncake_prompt(uint64_t seed, const uint64_t *ids, size_t nids,
                              size_t input_tokens, kvr_buf *out);

#endif
