/* Deterministic embeddings. */
#include "embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvr_sim_embed_vector(uint64_t key, float *out, size_t dim)
{
    uint64_t s = key;
    double norm = 0;
    for (size_t i = 0; i < dim; i++) {
        /* uniform in [-1, 1), 24 bits: exact in a float */
        out[i] = (float)((double)(splitmix64(&s) >> 40) / (double)(1u << 23) - 1.0);
        norm += (double)out[i] * out[i];
    }
    norm = sqrt(norm);
    for (size_t i = 0; i < dim; i++)
        out[i] = norm > 0 ? (float)(out[i] / norm) : (float)(i == 0);
}

static uint64_t vector_key(const char *model, const uint32_t *ids, size_t n)
{
    return XXH3_64bits_withSeed(ids, n * sizeof(*ids), XXH3_64bits(model, strlen(model)));
}

static int put_base64(kvr_buf *b, const float *v, size_t dim)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char bytes[3];
    size_t nb = dim * 4;
    int rc = kvr_buf_append(b, "\"", 1);
    for (size_t i = 0; i < nb && !rc; i += 3) {
        for (size_t j = 0; j < 3; j++) {
            size_t at = i + j;
            uint32_t u;
            if (at < nb) {
                memcpy(&u, &v[at / 4], 4); /* little-endian hosts only (x86-64, arm64) */
                bytes[j] = (unsigned char)(u >> (8 * (at % 4)));
            } else {
                bytes[j] = 0;
            }
        }
        char q[4] = {tab[bytes[0] >> 2], tab[(bytes[0] & 3) << 4 | bytes[1] >> 4],
                     tab[(bytes[1] & 15) << 2 | bytes[2] >> 6], tab[bytes[2] & 63]};
        size_t left = nb - i;
        if (left < 3)
            q[3] = '=';
        if (left < 2)
            q[2] = '=';
        rc |= kvr_buf_append(b, q, 4);
    }
    return rc | kvr_buf_append(b, "\"", 1);
}

static int put_vector(kvr_buf *b, const float *v, size_t dim, int base64)
{
    if (base64)
        return put_base64(b, v, dim);
    int rc = kvr_buf_append(b, "[", 1);
    for (size_t i = 0; i < dim && !rc; i++) {
        char num[32];
        int n = snprintf(num, sizeof(num), i ? ",%.9g" : "%.9g", (double)v[i]);
        rc |= kvr_buf_append(b, num, (size_t)n);
    }
    return rc | kvr_buf_append(b, "]", 1);
}

/* One input as token ids into `t`. Returns 0, or 400 with `msg`. */
static int input_ids(const json_t *in, const kvr_sim_embed_opts *o, kvr_sim_toks *t, char *msg,
                     size_t cap)
{
    if (json_is_string(in)) {
        if (o->add_special_tokens)
            kvr_sim_toks_push(t, KVR_SIM_TOK_BOS);
        kvr_sim_tokenize(t, json_string_value(in), json_string_length(in));
        return 0;
    }
    size_t i;
    const json_t *v;
    json_array_foreach(in, i, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)KVR_SIM_VOCAB) {
            snprintf(msg, cap, "token ids must be integers in [0, %u)", KVR_SIM_VOCAB);
            return 400;
        }
        kvr_sim_toks_push(t, (uint32_t)id);
    }
    return 0;
}

/* The inputs of `input`: itself (a string or one token-id array), or its elements. */
static int is_single(const json_t *input)
{
    return json_is_string(input) ||
           (json_array_size(input) && json_is_integer(json_array_get(input, 0)));
}

int kvr_sim_embed_data(const json_t *input, const kvr_sim_embed_opts *o, kvr_buf *out,
                       size_t *tokens, uint64_t *digest, char *msg, size_t cap)
{
    const char *shape = "'input' must be a string, an array of strings, an array of token ids "
                        "or an array of token-id arrays";
    if (!json_is_string(input) && (!json_is_array(input) || !json_array_size(input))) {
        snprintf(msg, cap, "%s", input ? shape : "'input' is required");
        return 400;
    }
    int single = is_single(input);
    size_t n = single ? 1 : json_array_size(input);
    if (n > KVR_SIM_EMBED_INPUTS_MAX) {
        snprintf(msg, cap, "at most %d inputs per request", KVR_SIM_EMBED_INPUTS_MAX);
        return 400;
    }
    float *vec = malloc(o->dim * sizeof(*vec));
    if (!vec)
        return 503;
    int rc = 0, oom = kvr_buf_append(out, "[", 1);
    *tokens = 0;
    uint64_t all = 0;
    for (size_t i = 0; i < n && !rc && !oom; i++) {
        const json_t *in = single ? input : json_array_get(input, i);
        if (!json_is_string(in) && !json_is_array(in)) {
            snprintf(msg, cap, "%s", shape);
            rc = 400;
            break;
        }
        kvr_sim_toks t;
        kvr_sim_toks_init(&t, o->max_model_len);
        t.seen = o->seen;
        rc = input_ids(in, o, &t, msg, cap);
        if (!rc && t.total > o->max_model_len) {
            snprintf(msg, cap, "This model's maximum context length is %zu tokens. However, "
                     "input %zu has %zu tokens. Please reduce the length of the input.",
                     o->max_model_len, i, t.total);
            rc = 400;
        }
        if (!rc && t.oom)
            rc = 503;
        if (!rc) {
            uint64_t key = vector_key(o->model, t.ids, t.len);
            all = XXH3_64bits_withSeed(&key, sizeof(key), all);
            kvr_sim_embed_vector(key, vec, o->dim);
            *tokens += t.len;
            char head[80];
            int hn = snprintf(head, sizeof(head), "%s{\"index\":%zu,\"object\":\"embedding\","
                              "\"embedding\":", i ? "," : "", i);
            oom |= kvr_buf_append(out, head, (size_t)hn);
            oom |= put_vector(out, vec, o->dim, o->base64);
            oom |= kvr_buf_append(out, "}", 1);
        }
        kvr_sim_toks_free(&t);
    }
    free(vec);
    *digest = all;
    if (!rc && (oom || kvr_buf_append(out, "]", 1)))
        rc = 503;
    return rc;
}
