/* Prefill/decode bodies and the prefill answer (see pd_body.h). */
#include "proxy/pd_body.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_read.h"

#define LIT(s) s, sizeof(s) - 1

/* The NixlConnector's request for a remote decode: the prefill worker keeps the prompt's
 * blocks and names them in its answer (vLLM's nixl_connector request_finished). */
static const char VLLM_PREFILL_KVTP[] =
    "{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
    "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}";

size_t kvr_pd_vllm_prefill_edits(kvr_body_edit *e)
{
    size_t n = 0;
    e[n++] = (kvr_body_edit){"stream", LIT("false"), 0};
    e[n++] = (kvr_body_edit){"max_tokens", LIT("1"), 0};
    e[n++] = (kvr_body_edit){"max_completion_tokens", LIT("1"), 1};
    e[n++] = (kvr_body_edit){"stream_options", NULL, 0, 0};
    e[n++] = (kvr_body_edit){"min_tokens", NULL, 0, 0};
    e[n++] = (kvr_body_edit){"min_completion_tokens", NULL, 0, 0};
    e[n++] = (kvr_body_edit){"kv_transfer_params", LIT(VLLM_PREFILL_KVTP), 0};
    return n;
}

size_t kvr_pd_vllm_decode_edits(const char *kvtp, size_t len, kvr_body_edit *e)
{
    e[0] = (kvr_body_edit){"kv_transfer_params", kvtp, len, 0};
    return 1;
}

int kvr_pd_bootstrap_init(kvr_pd_bootstrap *bs, const char *url, uint16_t port, uint64_t room)
{
    memset(bs, 0, sizeof(*bs));
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    size_t n;
    if (*h == '[') { /* an IPv6 literal: up to its bracket */
        const char *e = strchr(h, ']');
        n = e ? (size_t)(e - h) + 1 : 0;
    } else {
        n = strcspn(h, ":/?#");
    }
    if (!n || n >= sizeof(bs->host))
        return -1;
    memcpy(bs->host, h, n);
    bs->port = port;
    bs->room = room & INT64_MAX;
    return 0;
}

size_t kvr_pd_sglang_edits(kvr_pd_bootstrap *bs, kvr_body_edit *e)
{
    json_t *s = json_string(bs->host);
    char *enc = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    snprintf(bs->text[0], sizeof(bs->text[0]), "%s", enc ? enc : "null");
    free(enc);
    snprintf(bs->text[1], sizeof(bs->text[1]), "%u", (unsigned)bs->port);
    snprintf(bs->text[2], sizeof(bs->text[2]), "%" PRIu64, bs->room);
    const char *keys[3] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};
    for (size_t i = 0; i < 3; i++)
        e[i] = (kvr_body_edit){keys[i], bs->text[i], strlen(bs->text[i]), 0};
    return 3;
}

/* The fields vLLM's NixlConnector defines, where present, of the types it reads
 * (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py: remote_block_ids a list of
 * block ids, remote_engine_id and remote_host strings, remote_port a port): a prefill answer
 * naming them otherwise would only make the decode worker refuse the request, so it counts as
 * a prefill failure. Other connectors' fields pass as they are. */
static int nixl_fields_ok(const json_t *kv)
{
    const json_t *ids = json_object_get(kv, "remote_block_ids");
    if (ids && !json_is_null(ids)) {
        if (!json_is_array(ids))
            return 0;
        size_t i;
        const json_t *v;
        json_array_foreach(ids, i, v)
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                return 0;
    }
    static const char *const strs[] = {"remote_engine_id", "remote_host"};
    for (size_t i = 0; i < sizeof(strs) / sizeof(*strs); i++) {
        const json_t *v = json_object_get(kv, strs[i]);
        if (v && !json_is_null(v) && !json_is_string(v))
            return 0;
    }
    const json_t *port = json_object_get(kv, "remote_port");
    return !port || json_is_null(port) ||
           (json_is_integer(port) && json_integer_value(port) > 0 &&
            json_integer_value(port) <= 65535);
}

int kvr_pd_read_answer(const char *body, size_t len, kvr_pd_answer *a)
{
    *a = (kvr_pd_answer){.prompt = -1};
    json_t *j = kvr_json_read(body, len, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return -1;
    }
    json_t *kv = json_object_get(j, "kv_transfer_params");
    if (json_is_object(kv) && nixl_fields_ok(kv))
        a->kvtp = json_dumps(kv, JSON_COMPACT);
    json_t *u = json_object_get(j, "usage");
    json_t *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(pt) && json_integer_value(pt) >= 0)
        a->prompt = json_integer_value(pt);
    json_t *ct = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0)
        a->cached = json_integer_value(ct);
    json_decref(j);
    return 0;
}

void kvr_pd_answer_free(kvr_pd_answer *a)
{
    free(a->kvtp);
    a->kvtp = NULL;
}
