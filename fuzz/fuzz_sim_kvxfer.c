/* libFuzzer harness for kvroute-sim's KV-transfer parsers (sim/kvxfer.c): the transfer answer
 * a decode reads from a prefill, the kv_transfer_params / bootstrap fields of a request body
 * and the %-unescaping of a transfer id. Any bytes must never crash, leak or invoke undefined
 * behaviour; an accepted answer must hold exactly n × block_size token ids below the vocabulary
 * and survive a write/parse round trip unchanged.
 *
 * The first input byte picks the block size (1..16) and the block cap; the rest is the input,
 * read by all three parsers. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer.h"
#include "util/json_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t bs = (uint32_t)(data[0] & 15) + 1;
    size_t max_blocks = (size_t)(data[0] >> 4) * 4;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    char err[200];

    kvr_sim_xfer_blocks b;
    if (kvr_sim_xfer_parse(body, len, bs, max_blocks, 1000, &b, err, sizeof(err)) == 0) {
        if (b.n > max_blocks || b.block_size != bs)
            abort();
        for (size_t i = 0; i < b.n * bs; i++)
            if (b.tokens[i] >= 1000)
                abort();
        kvr_buf out;
        kvr_buf_init(&out, 0);
        if (kvr_sim_xfer_write(&out, "id", "engine", bs, b.block_ids, b.n, b.tokens) != 0)
            abort();
        kvr_sim_xfer_blocks c;
        if (kvr_sim_xfer_parse(out.data, out.len, bs, max_blocks, 1000, &c, err, sizeof(err)) ||
            c.n != b.n || memcmp(c.block_ids, b.block_ids, b.n * sizeof(uint32_t)) ||
            memcmp(c.tokens, b.tokens, b.n * bs * sizeof(uint32_t)))
            abort();
        kvr_sim_xfer_blocks_free(&c);
        kvr_buf_free(&out);
        kvr_sim_xfer_blocks_free(&b);
    }

    json_error_t jerr;
    json_t *j = kvr_json_read(body, len, &jerr);
    if (j) {
        kvr_sim_xfer_params p;
        const char *param;
        if (kvr_sim_xfer_read_params(j, max_blocks, &p, err, sizeof(err), &param) == 0) {
            if (p.nremote_block_ids > max_blocks || (p.remote_port < 0 || p.remote_port > 65535))
                abort();
            kvr_sim_xfer_params_free(&p);
        } else if (p.remote_block_ids) {
            abort(); /* a refused request keeps nothing */
        }
        json_decref(j);
    }

    char *s = malloc(len + 1), out[64], back[64];
    if (!s)
        return 0;
    memcpy(s, body, len);
    s[len] = 0;
    if (kvr_sim_xfer_unescape(s, out, sizeof(out)) == 0 &&
        kvr_sim_xfer_escape(out, back, sizeof(back)) == 0) {
        char again[64];
        if (kvr_sim_xfer_unescape(back, again, sizeof(again)) != 0 || strcmp(again, out) != 0)
            abort();
    }
    free(s);
    return 0;
}
