/* kvroute-sim's emulated KV transfer between a prefill sim and a decode sim (docs/sim.md,
 * "Prefill/decode"): the request fields that ask for it, and the bytes of the transfer.
 *
 * Request fields (parsed from a chat or completions body):
 *   kv_transfer_params  vLLM's NixlConnector dict: do_remote_decode (a prefill keeps the blocks
 *                       for a decode), do_remote_prefill (a decode fetches them),
 *                       remote_engine_id, remote_block_ids, remote_host, remote_port,
 *                       remote_request_id (what the prefill answered). Other keys (tp_size, …)
 *                       are ignored, as vLLM's connector ignores what it does not use.
 *   bootstrap_host, bootstrap_port, bootstrap_room   SGLang's disaggregation handshake: the
 *                       prefill keeps the room's KV, the decode pulls it from the prefill's
 *                       bootstrap server.
 *
 * The transfer: the decode GETs http://HOST:PORT/sim/kv_transfer/<remote_request_id> (or
 * /sim/bootstrap/<room>), optionally with ?wait_ms=N (the prefill answers once the KV exists,
 * within N ms), and gets
 *   {"remote_request_id": "...", "engine_id": "...", "block_size": 16,
 *    "block_ids": [ids in prefix order], "token_ids": [block_ids × block_size ids]}
 * The token ids stand in for the KV bytes: the decode checks they are its own prompt's, as the
 * KV of another prompt would be useless, then caches them as computed blocks. */
#ifndef KVR_SIM_KVXFER_H
#define KVR_SIM_KVXFER_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

#define KVR_SIM_XFER_STR 256 /* longest remote_host / remote_request_id / remote_engine_id */

/** What a request asks of the KV transfer. Strings are copied (NUL-terminated; "" = absent). */
typedef struct kvr_sim_xfer_params {
    int has_params;        /**< kv_transfer_params is an object */
    int do_remote_decode;  /**< 1: the prefill side of vLLM's NixlConnector */
    int do_remote_prefill; /**< 1: the decode side */
    char remote_engine_id[KVR_SIM_XFER_STR];
    char remote_host[KVR_SIM_XFER_STR];
    char remote_request_id[KVR_SIM_XFER_STR];
    int remote_port;       /**< 0 = absent */
    uint32_t *remote_block_ids; /**< malloc'd (kvr_sim_xfer_params_free), NULL when absent */
    size_t nremote_block_ids;
    int has_room;          /**< bootstrap_room given */
    uint64_t room;         /**< bootstrap_room (SGLang: a 63-bit integer) */
    char bootstrap_host[KVR_SIM_XFER_STR];
    int bootstrap_port;    /**< 0 = absent */
} kvr_sim_xfer_params;

/** Reads kv_transfer_params and the bootstrap fields of request `body` (a JSON object) into
 *  `p` (zeroed first). Absent or null fields are absent. Returns 0, or -1 with a message in
 *  `err` and the offending field in `*param` (the request is a 400): wrong types, a port
 *  outside 1..65535, a negative room or block id, strings over KVR_SIM_XFER_STR - 1 bytes,
 *  more than `max_blocks` block ids. */
int kvr_sim_xfer_read_params(const json_t *body, size_t max_blocks, kvr_sim_xfer_params *p,
                             char *err, size_t cap, const char **param);
/** Frees what kvr_sim_xfer_read_params allocated (the struct itself is the caller's). */
void kvr_sim_xfer_params_free(kvr_sim_xfer_params *p);

/** A transfer's content, as the decode receives it. */
typedef struct kvr_sim_xfer_blocks {
    uint32_t *block_ids; /**< n ids (malloc'd) */
    size_t n;
    uint32_t *tokens;    /**< n × block_size ids (malloc'd) */
    uint32_t block_size;
} kvr_sim_xfer_blocks;

/** Appends the transfer JSON (above) to `out`. Returns 0 or -1 (buffer cap / OOM). */
int kvr_sim_xfer_write(kvr_buf *out, const char *request_id, const char *engine_id,
                       uint32_t block_size, const uint32_t *block_ids, size_t n,
                       const uint32_t *tokens);
/** Parses a transfer answer of `len` bytes (outside bytes: any content is handled). Checks the
 *  shape, that block_size equals `block_size`, that there are at most `max_blocks` blocks and
 *  exactly n × block_size token ids below `vocab`. Returns 0 with `out` filled (free with
 *  kvr_sim_xfer_blocks_free), or -1 with a reason in `err`. */
int kvr_sim_xfer_parse(const char *body, size_t len, uint32_t block_size, size_t max_blocks,
                       uint32_t vocab, kvr_sim_xfer_blocks *out, char *err, size_t cap);
void kvr_sim_xfer_blocks_free(kvr_sim_xfer_blocks *b);

/** Percent-encodes `s` for one URL path segment (unreserved bytes kept). Returns 0, or -1
 *  when `out` (of `cap` bytes) is too small. */
int kvr_sim_xfer_escape(const char *s, char *out, size_t cap);
/** Decodes %XX escapes of a path segment into `out`. Returns 0, or -1 for a bad escape, a
 *  NUL byte or a too small `out`. */
int kvr_sim_xfer_unescape(const char *s, char *out, size_t cap);

#endif
