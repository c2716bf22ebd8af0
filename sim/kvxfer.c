/* KV-transfer request fields and transfer bytes. */
#include "kvxfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_read.h"

/* An optional string field of `o` into `out`. 0 = fine (absent or copied), -1 = bad. */
static int get_str(const json_t *o, const char *k, char *out, char *err, size_t cap)
{
    const json_t *v = json_object_get(o, k);
    out[0] = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v) || json_string_length(v) >= KVR_SIM_XFER_STR ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        snprintf(err, cap, "'%s' must be a string of at most %d bytes", k, KVR_SIM_XFER_STR - 1);
        return -1;
    }
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int get_port(const json_t *o, const char *k, int *out, char *err, size_t cap)
{
    const json_t *v = json_object_get(o, k);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535) {
        snprintf(err, cap, "'%s' must be a port number (1 to 65535)", k);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_flag(const json_t *o, const char *k, int *out, char *err, size_t cap)
{
    const json_t *v = json_object_get(o, k);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, cap, "'%s' must be a boolean", k);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int get_block_ids(const json_t *o, size_t max, kvr_sim_xfer_params *p, char *err,
                         size_t cap)
{
    const json_t *v = json_object_get(o, "remote_block_ids");
    if (!v || json_is_null(v))
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_array(v) || n > max) {
        snprintf(err, cap, "'remote_block_ids' must be an array of at most %zu block ids", max);
        return -1;
    }
    p->remote_block_ids = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!p->remote_block_ids) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > (json_int_t)UINT32_MAX) {
            snprintf(err, cap, "'remote_block_ids' must hold non-negative integers (item %zu)",
                     i);
            return -1;
        }
        p->remote_block_ids[i] = (uint32_t)json_integer_value(x);
    }
    p->nremote_block_ids = n;
    return 0;
}

int kvr_sim_xfer_read_params(const json_t *body, size_t max_blocks, kvr_sim_xfer_params *p,
                             char *err, size_t cap, const char **param)
{
    memset(p, 0, sizeof(*p));
    const json_t *kp = json_object_get(body, "kv_transfer_params");
    *param = "kv_transfer_params";
    if (kp && !json_is_null(kp)) {
        if (!json_is_object(kp)) {
            snprintf(err, cap, "'kv_transfer_params' must be an object");
            return -1;
        }
        p->has_params = 1;
        if (get_flag(kp, "do_remote_decode", &p->do_remote_decode, err, cap) < 0 ||
            get_flag(kp, "do_remote_prefill", &p->do_remote_prefill, err, cap) < 0 ||
            get_str(kp, "remote_engine_id", p->remote_engine_id, err, cap) < 0 ||
            get_str(kp, "remote_host", p->remote_host, err, cap) < 0 ||
            get_str(kp, "remote_request_id", p->remote_request_id, err, cap) < 0 ||
            get_port(kp, "remote_port", &p->remote_port, err, cap) < 0 ||
            get_block_ids(kp, max_blocks, p, err, cap) < 0)
            goto bad;
    }
    const json_t *room = json_object_get(body, "bootstrap_room");
    if (room && !json_is_null(room)) {
        *param = "bootstrap_room";
        if (!json_is_integer(room) || json_integer_value(room) < 0) {
            snprintf(err, cap, "'bootstrap_room' must be a non-negative integer");
            goto bad;
        }
        p->has_room = 1;
        p->room = (uint64_t)json_integer_value(room);
    }
    *param = "bootstrap_host";
    if (get_str(body, "bootstrap_host", p->bootstrap_host, err, cap) < 0)
        goto bad;
    *param = "bootstrap_port";
    if (get_port(body, "bootstrap_port", &p->bootstrap_port, err, cap) < 0)
        goto bad;
    *param = NULL;
    return 0;
bad:
    kvr_sim_xfer_params_free(p);
    return -1;
}

void kvr_sim_xfer_params_free(kvr_sim_xfer_params *p)
{
    free(p->remote_block_ids);
    p->remote_block_ids = NULL;
    p->nremote_block_ids = 0;
}

static int put_ids(kvr_buf *b, const uint32_t *ids, size_t n)
{
    char tmp[16];
    int rc = kvr_buf_puts(b, "[");
    for (size_t i = 0; i < n && !rc; i++) {
        int w = snprintf(tmp, sizeof(tmp), i ? ",%u" : "%u", ids[i]);
        rc |= kvr_buf_append(b, tmp, (size_t)w);
    }
    return rc | kvr_buf_puts(b, "]");
}

/* The ids written here are ours (request and engine ids): still escaped, as they may come
 * from a client's X-Request-Id. */
static int put_str(kvr_buf *b, const char *s)
{
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    int rc = t ? kvr_buf_puts(b, t) : -1;
    free(t);
    return rc;
}

int kvr_sim_xfer_write(kvr_buf *out, const char *request_id, const char *engine_id,
                       uint32_t block_size, const uint32_t *block_ids, size_t n,
                       const uint32_t *tokens)
{
    char bs[16];
    snprintf(bs, sizeof(bs), "%u", block_size);
    int rc = kvr_buf_puts(out, "{\"remote_request_id\":");
    rc |= put_str(out, request_id);
    rc |= kvr_buf_puts(out, ",\"engine_id\":");
    rc |= put_str(out, engine_id);
    rc |= kvr_buf_puts(out, ",\"block_size\":");
    rc |= kvr_buf_puts(out, bs);
    rc |= kvr_buf_puts(out, ",\"block_ids\":");
    rc |= put_ids(out, block_ids, n);
    rc |= kvr_buf_puts(out, ",\"token_ids\":");
    rc |= put_ids(out, tokens, n * block_size);
    return rc | kvr_buf_puts(out, "}");
}

/* Fills `out` (n ids) from a JSON array of integers below `limit`. */
static int read_u32s(const json_t *a, uint32_t *out, size_t n, uint64_t limit)
{
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            (uint64_t)json_integer_value(x) >= limit)
            return -1;
        out[i] = (uint32_t)json_integer_value(x);
    }
    return 0;
}

int kvr_sim_xfer_parse(const char *body, size_t len, uint32_t block_size, size_t max_blocks,
                       uint32_t vocab, kvr_sim_xfer_blocks *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *j = kvr_json_read(body, len, &jerr);
    const json_t *ids = json_object_get(j, "block_ids"), *toks = json_object_get(j, "token_ids");
    const json_t *bs = json_object_get(j, "block_size");
    int rc = -1;
    if (!json_is_object(j) || !json_is_array(ids) || !json_is_array(toks) ||
        !json_is_integer(bs)) {
        snprintf(err, cap, "not a transfer answer (block_size, block_ids, token_ids)");
        goto out;
    }
    if (json_integer_value(bs) != (json_int_t)block_size) {
        snprintf(err, cap, "block size %lld differs from ours (%u)",
                 (long long)json_integer_value(bs), block_size);
        goto out;
    }
    size_t n = json_array_size(ids);
    if (n > max_blocks || json_array_size(toks) != n * block_size) {
        snprintf(err, cap, "%zu blocks with %zu token ids (at most %zu blocks of %u)", n,
                 json_array_size(toks), max_blocks, block_size);
        goto out;
    }
    out->block_ids = malloc((n ? n : 1) * sizeof(uint32_t));
    out->tokens = malloc((n ? n * block_size : 1) * sizeof(uint32_t));
    out->n = n;
    out->block_size = block_size;
    if (!out->block_ids || !out->tokens) {
        snprintf(err, cap, "out of memory");
        goto out;
    }
    if (read_u32s(ids, out->block_ids, n, UINT32_MAX) < 0 ||
        read_u32s(toks, out->tokens, n * block_size, vocab) < 0) {
        snprintf(err, cap, "block ids and token ids must be integers in range");
        goto out;
    }
    rc = 0;
out:
    json_decref(j);
    if (rc)
        kvr_sim_xfer_blocks_free(out);
    return rc;
}

void kvr_sim_xfer_blocks_free(kvr_sim_xfer_blocks *b)
{
    free(b->block_ids);
    free(b->tokens);
    b->block_ids = b->tokens = NULL;
    b->n = 0;
}

int kvr_sim_xfer_escape(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_' || c == '.' || c == '~';
        if (o + (keep ? 1 : 3) >= cap)
            return -1;
        if (keep) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (o >= cap)
        return -1;
    out[o] = 0;
    return 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int kvr_sim_xfer_unescape(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s; s++) {
        char c = *s;
        if (c == '%') {
            int hi = s[1] ? hexval(s[1]) : -1, lo = hi >= 0 && s[2] ? hexval(s[2]) : -1;
            if (hi < 0 || lo < 0 || (hi | lo) == 0)
                return -1;
            c = (char)(hi * 16 + lo);
            s += 2;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = c;
    }
    out[o] = 0;
    return 0;
}
