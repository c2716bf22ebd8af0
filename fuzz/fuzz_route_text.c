/* libFuzzer harness: the routing text built from the scan of a body (routing/text_scan.h)
 * against the text built from its tree (routing/keys.h), for chat and completions.
 *
 * For every input kvr_json_scan() accepts (kvr_json_read() must then accept it too), the
 * scan text must equal the tree text byte for byte with the same return code: uncapped,
 * and cut at small caps (1 byte, 7 bytes, half the text, the text's length, one byte less).
 * The chat text is built three times from the scan: without a tools cache, then twice with
 * one (the first call may miss, the second must hit whenever there is a tools section), so
 * a cached tools section is checked against the tree as well. The cache also keeps message
 * texts (messages of 16 bytes and more, in 4 KB: the small budget evicts all the time), so
 * the second call finds each message's text the first one kept, cut and uncut. Messages are
 * read from where the scan placed them (kvr_body_messages()), all, the first only (the rest
 * walked to, as past KVR_BODY_MESSAGES_MAX), or none.
 *
 * Every input is scanned twice: plainly, and taking the messages whose texts the cache keeps
 * as accepted before (kvr_text_cache_known(), as the router does). Both must accept the same
 * inputs and give the same fields and message places (kind, offsets, counts, roles); the
 * texts built with the cache come from the second scan, whose elements carry the hashes the
 * text lookup then uses.
 *
 * A text built with the cache has an id (kvr_route_text_scan_id()); the same bytes give the
 * same id whatever the cache held and however the messages were reached, so the two cached
 * builds of a chat text must give one id. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "routing/fields.h"
#include "routing/keys.h"
#include "routing/text_scan.h"
#include "util/json_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvr_text_cache *g_cache;
static uint64_t g_id; /* the id of the last text built with the cache */

/* The text from the scan for `kind` (chat or completions), cap `cap`, into `out`. */
static int scan_text(const kvr_body_fields *f, kvr_route_kind kind, kvr_text_cache *cache,
                     int placed, kvr_buf *out)
{
    if (kind == KVR_ROUTE_COMPLETIONS)
        return kvr_route_text_scan_prompt(f->buf, kvr_body_field(f, KVR_FIELD_PROMPT), out);
    size_t nm;
    const kvr_json_elem *ms = kvr_body_messages(f, &nm);
    if (!placed) /* walk to every message */
        ms = NULL;
    else if (placed == 2 && nm > 1) /* the first placed, the rest walked to (a long body) */
        nm = 1;
    return kvr_route_text_scan_id(f->buf, kvr_body_field(f, KVR_FIELD_TOOLS),
                                  kvr_body_field(f, KVR_FIELD_FUNCTIONS),
                                  kvr_body_field(f, KVR_FIELD_MESSAGES), ms, nm, cache, out,
                                  cache ? &g_id : NULL);
}

static void check(const kvr_body_fields *f, const json_t *tree, kvr_route_kind kind,
                  size_t cap, kvr_text_cache *cache, int placed)
{
    kvr_buf a, b;
    kvr_buf_init(&a, cap);
    kvr_buf_init(&b, cap);
    int ra = kvr_route_text_build(tree, kind, &a);
    int rb = scan_text(f, kind, cache, placed, &b);
    if (ra < 0 || rb < 0)
        abort(); /* out of memory: not a finding */
    if (ra != rb || a.len != b.len || (a.len && memcmp(a.data, b.data, a.len) != 0))
        __builtin_trap();
    kvr_buf_free(&a);
    kvr_buf_free(&b);
}

/* The two scans agree on everything but what find() left for the text lookup. */
static void same_scan(int ra, const kvr_body_fields *a, int rb, const kvr_body_fields *b)
{
    if (ra != rb)
        __builtin_trap();
    if (ra < 0)
        return;
    if (a->n != b->n || a->object != b->object ||
        memcmp(a->v, b->v, a->n * sizeof(a->v[0])) != 0)
        __builtin_trap();
    size_t na, nb;
    const kvr_json_elem *ea = kvr_body_messages(a, &na), *eb = kvr_body_messages(b, &nb);
    if (na != nb)
        __builtin_trap();
    for (size_t i = 0; i < na; i++)
        if (ea[i].off != eb[i].off || ea[i].len != eb[i].len || ea[i].kind != eb[i].kind ||
            ea[i].role != eb[i].role)
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_body_fields plain, f;
    if (!g_cache && !(g_cache = kvr_text_cache_new(4096, 16)))
        abort();
    const char *buf = (const char *)data;
    kvr_json_known kn;
    if (!kvr_text_cache_known(g_cache, &kn))
        abort();
    int rp = kvr_body_fields_scan(&plain, buf, size, NULL);
    int rk = kvr_body_fields_scan_known(&f, buf, size, NULL, &kn);
    same_scan(rp, &plain, rk, &f);
    if (rk < 0)
        return 0;
    json_t *tree = kvr_json_read(buf, size, NULL);
    if (!tree)
        __builtin_trap(); /* json_scan.h: the same acceptance */
    if (!f.object) { /* an array body has no text; the scan sees no members */
        json_decref(tree);
        return 0;
    }
    for (int k = 0; k < 2; k++) {
        kvr_route_kind kind = k ? KVR_ROUTE_COMPLETIONS : KVR_ROUTE_CHAT;
        kvr_buf full;
        kvr_buf_init(&full, 0);
        if (kvr_route_text_build(tree, kind, &full) < 0)
            abort();
        check(&f, tree, kind, 0, NULL, 0);
        check(&f, tree, kind, 0, NULL, 1);
        if (kind == KVR_ROUTE_CHAT) {
            uint64_t h0, m0, h1, m1;
            kvr_text_cache_stats(g_cache, &h0, &m0);
            check(&f, tree, kind, 0, g_cache, 2);
            uint64_t id = g_id;
            check(&f, tree, kind, 0, g_cache, 1);
            if (!id || id != g_id)
                __builtin_trap(); /* the id is the bytes', not the cache's or the walk's */
            kvr_text_cache_stats(g_cache, &h1, &m1);
            if (h1 + m1 != h0 + m0 && h1 == h0)
                __builtin_trap(); /* the second lookup of the same tools must hit */
        }
        size_t caps[] = {1, 7, full.len / 2, full.len, full.len > 1 ? full.len - 1 : 0};
        for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
            if (caps[i]) {
                check(&f, tree, kind, caps[i], NULL, (int)(i % 3));
                if (kind == KVR_ROUTE_CHAT)
                    check(&f, tree, kind, caps[i], g_cache, (int)((i + 1) % 3));
            }
        kvr_buf_free(&full);
    }
    json_decref(tree);
    return 0;
}
