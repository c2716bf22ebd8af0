/* The bodies of prefill/decode disaggregation (issue 21), as top-level edits of the client's
 * JSON (proxy/body_edit.h: everything else byte-identical, framing recomputed), and the
 * reading of a prefill worker's answer.
 *
 * vLLM (NixlConnector; the vllm-project/router's two-stage flow): the prefill worker gets a
 * copy with `stream: false`, `max_tokens: 1` (and `max_completion_tokens: 1` where given),
 * without `stream_options`, `min_tokens`, `min_completion_tokens`, and with
 * `kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_engine_id:
 * null, remote_block_ids: null, remote_host: null, remote_port: null}`; its JSON answer's
 * `kv_transfer_params` go with the original request to the decode worker.
 * SGLang (bootstrap): both workers get the request with `bootstrap_host`, `bootstrap_port`
 * and `bootstrap_room`. */
#ifndef KVR_PROXY_PD_BODY_H
#define KVR_PROXY_PD_BODY_H
#include <stddef.h>
#include <stdint.h>

#include "proxy/body_edit.h"

/** Most edits any function below writes. */
#define KVR_PD_MAX_EDITS 8

/** The vLLM prefill copy's edits into `e` (room for KVR_PD_MAX_EDITS); returns how many. */
size_t kvr_pd_vllm_prefill_edits(kvr_body_edit *e);

/** The decode request's edit: `kv_transfer_params` set to `kvtp` (len bytes of JSON, the
 *  prefill answer's, borrowed). Returns 1. */
size_t kvr_pd_vllm_decode_edits(const char *kvtp, size_t len, kvr_body_edit *e);

/** An SGLang bootstrap: where the decode worker fetches the prompt's KV from. */
typedef struct kvr_pd_bootstrap {
    char host[256];    /**< the prefill worker's host as its URL names it */
    uint16_t port;     /**< its bootstrap_port */
    uint64_t room;     /**< a fresh 63-bit id shared by both calls */
    char text[3][280]; /**< the members' JSON values (kvr_pd_sglang_edits writes them) */
} kvr_pd_bootstrap;

/** Fills `bs` for prefill worker URL `url` (http://HOST[:PORT]...; IPv6 brackets kept),
 *  `port` and `room` (masked to 63 bits). Returns 0, or -1 when the URL has no host. */
int kvr_pd_bootstrap_init(kvr_pd_bootstrap *bs, const char *url, uint16_t port, uint64_t room);

/** The SGLang edits (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`) into `e`, their
 *  values kept in `bs`. Returns 3. */
size_t kvr_pd_sglang_edits(kvr_pd_bootstrap *bs, kvr_body_edit *e);

/** What a prefill worker answered (its whole JSON body). */
typedef struct kvr_pd_answer {
    char *kvtp;        /**< its `kv_transfer_params` object as compact JSON (malloc'd), NULL
                            when absent, null, not an object, or naming a
                            NixlConnector field with the wrong type (a list of block ids, string
                            engine id and host, a port) */
    int64_t prompt;    /**< usage.prompt_tokens, -1 when absent */
    int64_t cached;    /**< usage.prompt_tokens_details.cached_tokens, 0 when absent */
} kvr_pd_answer;

/** Reads `len` bytes of a prefill worker's answer (outside bytes: anything is accepted and
 *  read strictly as JSON, kvr_json_read). Returns 0 with `a` filled (free with
 *  kvr_pd_answer_free), or -1 when the body is no JSON object (then `a` is empty). */
int kvr_pd_read_answer(const char *body, size_t len, kvr_pd_answer *a);
void kvr_pd_answer_free(kvr_pd_answer *a);

#endif
