/* libFuzzer harness for the W3C traceparent parser (src/obs/traceparent.c), which reads a
 * header every client may send. Checks the contracts: an accepted value has non-zero ids and a
 * valid shape, formatting what was parsed gives back the input's first 55 bytes with version
 * 00 (exactly the input for version 00), and the formatted value parses to the same context. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "obs/traceparent.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size heap copy, so ASan sees any read past the value. */
    char *s = malloc(size ? size : 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    kvr_trace_parent p, q;
    if (kvr_traceparent_parse(s, size, &p) == 0) {
        static const uint8_t zero[16];
        if (!memcmp(p.trace_id, zero, 16) || !memcmp(p.span_id, zero, 8))
            abort();
        char out[KVR_TRACEPARENT_LEN + 1];
        kvr_traceparent_format(p.trace_id, p.span_id, p.flags, out);
        if (size < KVR_TRACEPARENT_LEN || memcmp(out + 2, s + 2, KVR_TRACEPARENT_LEN - 2) != 0)
            abort();
        if (s[0] == '0' && s[1] == '0' && size != KVR_TRACEPARENT_LEN)
            abort();
        if (kvr_traceparent_parse(out, KVR_TRACEPARENT_LEN, &q) != 0 || memcmp(&p, &q, sizeof(p)))
            abort();
    }
    free(s);
    return 0;
}
