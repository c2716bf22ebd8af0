/* libFuzzer harness for the native upstream client's response parser (src/upstream/
 * respparse.c): any bytes a worker sends must never crash, leak or invoke undefined behaviour,
 * and where the socket reads ended must not change the outcome.
 *
 * The first input byte picks the request method (HEAD or not) and seeds the cuts; the rest is
 * the worker's byte stream. It is parsed as the client does (native.c: each read consumed
 * whole, event by event, then the next read; kvr_resp_eof() at the end), once whole and once
 * split at up to 16 positions derived from the input (or at every byte for short inputs).
 * Both runs must give the same status, the same delivered headers, the same decoded body bytes
 * and the same end: complete with nothing after it, complete with bytes after it (a body
 * longer than its framing), or an error. The dry run (kvr_resp_check_rest) made at the head
 * must agree with what the real parse then finds in the same read: when it reports a problem,
 * the response cannot end cleanly. The whole input is parsed a third time with the fast path
 * off (http_parser for every byte): the fast path must give the very same outcome. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "upstream/respparse.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { END_CLEAN = 1, END_EXCESS, END_ERROR };

typedef struct outcome {
    int status, end, heads, keep_alive;
    kvr_buf hdrs, body;
} outcome;

static uint64_t hash(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void record_head(outcome *o, const kvr_resp *r)
{
    o->heads++;
    o->status = r->status;
    for (size_t i = 0; i < r->nhdrs; i++) {
        kvr_buf_append(&o->hdrs, r->hdrs[i].name, r->hdrs[i].name_len);
        kvr_buf_append(&o->hdrs, "\0", 1);
        kvr_buf_append(&o->hdrs, r->hdrs[i].value, r->hdrs[i].value_len);
        kvr_buf_append(&o->hdrs, "\0", 1);
    }
}

/* Parses p[0, n) cut at cuts[0..ncuts) into *o. */
static void run(const char *p, size_t n, const size_t *cuts, size_t ncuts, int head_req,
                outcome *o)
{
    kvr_resp r;
    kvr_resp_init(&r);
    kvr_resp_reset(&r, head_req);
    int dry_bad = 0;
    size_t start = 0;
    for (size_t k = 0; k <= ncuts && !o->end; k++) {
        size_t end = k < ncuts ? cuts[k] : n;
        const char *seg = p + start;
        size_t len = end - start, off = 0;
        while (!o->end && off < len) {
            size_t used = 0, pl = 0;
            const char *piece = NULL;
            kvr_resp_ev ev = kvr_resp_feed(&r, seg + off, len - off, &used, &piece, &pl);
            if (used > len - off)
                __builtin_trap();
            off += used;
            switch (ev) {
            case KVR_RESP_MORE:
                if (off != len)
                    __builtin_trap(); /* MORE means everything was consumed */
                break;
            case KVR_RESP_HEAD: {
                if (o->heads || r.status < 100 || r.status > 999)
                    __builtin_trap();
                record_head(o, &r);
                const char *why = NULL;
                if (kvr_resp_check_rest(&r, seg + off, len - off, &why) < 0) {
                    if (!why)
                        __builtin_trap();
                    dry_bad = 1;
                }
                break;
            }
            case KVR_RESP_BODY:
                if (!o->heads || !pl || piece < seg || piece + pl > seg + len || head_req)
                    __builtin_trap();
                kvr_buf_append(&o->body, piece, pl);
                break;
            case KVR_RESP_DONE:
                o->end = start + off < n ? END_EXCESS : END_CLEAN;
                break;
            case KVR_RESP_ERROR:
                if (!r.err)
                    __builtin_trap();
                o->end = END_ERROR;
                break;
            }
        }
        start = end;
    }
    if (!o->end)
        o->end = kvr_resp_eof(&r) == KVR_RESP_DONE ? END_CLEAN : END_ERROR;
    if (o->end == END_CLEAN && !o->heads)
        __builtin_trap();
    if (dry_bad && o->end == END_CLEAN)
        __builtin_trap(); /* the dry run saw a problem the parse then did not */
    o->keep_alive = kvr_resp_keep_alive(&r);
    kvr_resp_free(&r);
}

static int same(const outcome *a, const outcome *b)
{
    return a->end == b->end && a->heads == b->heads && a->status == b->status &&
           a->keep_alive == b->keep_alive && a->hdrs.len == b->hdrs.len &&
           (!a->hdrs.len || !memcmp(a->hdrs.data, b->hdrs.data, a->hdrs.len)) &&
           a->body.len == b->body.len &&
           (!a->body.len || !memcmp(a->body.data, b->body.data, a->body.len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    int head_req = data[0] & 1;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    size_t cuts[64], nc = 0;
    if (n <= 64) {
        for (size_t i = 1; i < n; i++)
            cuts[nc++] = i;
    } else {
        uint64_t h = hash(data, size);
        size_t want = 1 + (size_t)(data[0] >> 4); /* 1..16 cuts */
        size_t last = 0;
        for (size_t i = 0; i < want; i++) {
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            size_t c = last + 1 + (size_t)((h >> 33) % (n / want + 1));
            if (c >= n)
                break;
            cuts[nc++] = c;
            last = c;
        }
    }
    outcome o[3];
    memset(o, 0, sizeof(o));
    for (int i = 0; i < 3; i++) {
        kvr_buf_init(&o[i].hdrs, 0);
        kvr_buf_init(&o[i].body, 0);
    }
    run(p, n, NULL, 0, head_req, &o[0]);
    run(p, n, cuts, nc, head_req, &o[1]);
    kvr_resp_fast_path(0);
    run(p, n, NULL, 0, head_req, &o[2]);
    kvr_resp_fast_path(1);
    for (int i = 1; i < 3; i++)
        if (!same(&o[0], &o[i]))
            __builtin_trap();
    for (int i = 0; i < 3; i++) {
        kvr_buf_free(&o[i].hdrs);
        kvr_buf_free(&o[i].body);
    }
    return 0;
}
