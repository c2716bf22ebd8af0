/* libFuzzer harness for prefill/decode disaggregation's parsers of outside bytes: the prefill
 * worker's answer (kvr_pd_read_answer, any bytes) and the body rewriter over a client's body
 * (kvr_body_edit_apply, any body kvr_json_read accepts, as api validated it). Checks the
 * contracts: an answer's kv_transfer_params, when read, is a JSON object that parses again;
 * every rewritten body is valid JSON whose top-level object has exactly the edits applied
 * (dropped members gone, set ones equal to their value, the others unchanged). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/body_edit.h"
#include "proxy/pd_body.h"
#include "util/json_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_edits(const char *body, size_t len, json_t *in, const kvr_body_edit *e,
                        size_t n)
{
    kvr_buf out;
    kvr_buf_init(&out, 0);
    int rc = kvr_body_edit_apply(body, len, e, n, &out);
    if (!json_is_object(in)) {
        if (rc == 0)
            abort();
        kvr_buf_free(&out);
        return;
    }
    if (rc != 0)
        abort();
    json_t *o = kvr_json_read(out.data ? out.data : "", out.len, NULL);
    if (!json_is_object(o))
        abort();
    /* What the edits say, over the input as read (the last duplicate wins in both). */
    json_t *want = json_deep_copy(in);
    for (size_t i = n; i-- > 0;) {
        if (!e[i].value) {
            json_object_del(want, e[i].key);
        } else if (!e[i].if_present || json_object_get(in, e[i].key)) {
            json_t *v = kvr_json_read(e[i].value, e[i].len, NULL);
            if (!v)
                v = json_loadb(e[i].value, e[i].len, JSON_DECODE_ANY, NULL);
            json_object_set_new(want, e[i].key, v);
        }
    }
    if (!json_equal(o, want))
        abort();
    json_decref(want);
    json_decref(o);
    kvr_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size ? size : 1); /* exact size: ASan sees any read past the end */
    if (!s)
        return 0;
    memcpy(s, data, size);
    kvr_pd_answer a;
    if (kvr_pd_read_answer(s, size, &a) == 0 && a.kvtp) {
        json_t *k = json_loads(a.kvtp, 0, NULL);
        if (!json_is_object(k))
            abort();
        json_decref(k);
    }
    kvr_pd_answer_free(&a);
    json_t *in = kvr_json_read(s, size, NULL);
    if (in) {
        kvr_body_edit e[KVR_PD_MAX_EDITS + 1];
        size_t n = kvr_pd_vllm_prefill_edits(e);
        check_edits(s, size, in, e, n);
        n = kvr_pd_vllm_decode_edits("{\"x\":[1]}", 9, e);
        e[n++] = (kvr_body_edit){"model", "\"m\"", 3, 1};
        check_edits(s, size, in, e, n);
        kvr_pd_bootstrap bs;
        kvr_pd_bootstrap_init(&bs, "http://h:1", 8998, 42);
        n = kvr_pd_sglang_edits(&bs, e);
        check_edits(s, size, in, e, n);
    }
    json_decref(in);
    free(s);
    return 0;
}
