/* vLLM KV-event batch decoder (contract in decode.h).
 *
 * Two guards run before msgpack-c sees the bytes. msgpack-c allocates an array's or map's
 * element slots as soon as it reads the header, trusting the declared count: the seven bytes
 * `93 00 dd 10 00 00 00` make it malloc 8 GiB. So a linear pre-pass checks that every container
 * declares no more elements than bytes remain (each element takes at least one byte), which
 * bounds msgpack-c's zone by a constant times the payload; and payloads over 64 MiB are refused
 * outright so that constant times the payload stays a sane amount of memory. msgpack-c itself
 * bounds nesting (32 levels).
 *
 * The object tree is then walked twice by the same code: the first walk validates and counts,
 * the second fills one allocation sized from those counts. Sharing the code means the second
 * walk cannot fail once the first succeeded, and the batch is released with a single free. */
#include "events/decode.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_PAYLOAD ((size_t)64 << 20)

/* The single block is laid out batch | events | hashes | tokens; these keep each part aligned. */
_Static_assert(sizeof(kvr_kv_batch) % _Alignof(kvr_kv_event) == 0, "events alignment");
_Static_assert(sizeof(kvr_kv_event) % _Alignof(uint64_t) == 0, "hashes alignment");

typedef struct walk {
    kvr_kv_batch *b;  /* NULL during the counting walk */
    uint64_t *hashes; /* the batch's hash and token arrays (fill walk only) */
    uint32_t *tokens;
    size_t nev, nhash, ntok, unknown;
    size_t at; /* index of the event being read, for messages; SIZE_MAX outside events */
    char *err;
    size_t errlen;
} walk;

__attribute__((format(printf, 2, 3))) static int bad(walk *w, const char *fmt, ...)
{
    if (!w->err || !w->errlen)
        return -1;
    size_t off = 0;
    if (w->at != SIZE_MAX) {
        int n = snprintf(w->err, w->errlen, "event %zu: ", w->at);
        off = n < 0 ? 0 : (size_t)n < w->errlen ? (size_t)n : w->errlen - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err + off, w->errlen - off, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- pre-pass over the raw bytes ---- */

static size_t be(const unsigned char *p, int n)
{
    size_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Returns NULL when `p` is exactly one well-framed msgpack object whose containers all fit the
 * bytes, else the reason. Counting the objects still owed is enough: no stack is needed to
 * frame msgpack, and the count can never legitimately exceed the bytes left. */
static const char *prescan(const unsigned char *p, size_t len)
{
    size_t pos = 0;
    uint64_t owed = 1; /* 64-bit: a map32 may declare 2^33 - 2 objects */
    while (owed) {
        if (pos >= len)
            return "truncated msgpack";
        unsigned c = p[pos++];
        size_t fixed = 0;
        uint64_t kids = 0;
        int lenw = 0, kind = 0; /* kind of a length field: 0 bytes, 1 elements, 2 pairs */
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
            ;
        else if (c <= 0x8f)
            kids = 2 * (uint64_t)(c & 0x0f);
        else if (c <= 0x9f)
            kids = c & 0x0f;
        else if (c <= 0xbf)
            fixed = c & 0x1f;
        else
            switch (c) {
            case 0xc4: case 0xd9: lenw = 1; break;
            case 0xc5: case 0xda: lenw = 2; break;
            case 0xc6: case 0xdb: lenw = 4; break;
            case 0xc7: lenw = 1, fixed = 1; break; /* ext: the type byte follows the length */
            case 0xc8: lenw = 2, fixed = 1; break;
            case 0xc9: lenw = 4, fixed = 1; break;
            case 0xcc: case 0xd0: fixed = 1; break;
            case 0xcd: case 0xd1: fixed = 2; break;
            case 0xca: case 0xce: case 0xd2: fixed = 4; break;
            case 0xcb: case 0xcf: case 0xd3: fixed = 8; break;
            case 0xd4: fixed = 2; break;
            case 0xd5: fixed = 3; break;
            case 0xd6: fixed = 5; break;
            case 0xd7: fixed = 9; break;
            case 0xd8: fixed = 17; break;
            case 0xdc: lenw = 2, kind = 1; break;
            case 0xdd: lenw = 4, kind = 1; break;
            case 0xde: lenw = 2, kind = 2; break;
            case 0xdf: lenw = 4, kind = 2; break;
            default: return "not msgpack (reserved byte 0xc1)";
            }
        if (lenw) {
            if (len - pos < (size_t)lenw)
                return "truncated msgpack";
            size_t n = be(p + pos, lenw);
            pos += (size_t)lenw;
            if (kind == 0)
                fixed += n;
            else
                kids = kind == 1 ? (uint64_t)n : 2 * (uint64_t)n;
        }
        if (fixed > len - pos)
            return "truncated msgpack";
        pos += fixed;
        owed = owed - 1 + kids;
        if (owed > len - pos)
            return "truncated msgpack (a container declares more elements than bytes left)";
    }
    return pos == len ? NULL : "trailing bytes after the batch";
}

/* ---- walking the object tree ---- */

static int is_str(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static int is_nil(const msgpack_object *o)
{
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

/* llm-d and Dynamo fold a bin digest to its last 8 bytes big-endian, which is also what vLLM's
 * int encoding keeps of the digest; negative ints come from old vLLM's Python hash(). */
static int get_hash(walk *w, const msgpack_object *o, const char *what, uint64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = (uint64_t)o->via.i64;
    } else if (o->type == MSGPACK_OBJECT_BIN) {
        const unsigned char *p = (const unsigned char *)o->via.bin.ptr;
        uint32_t n = o->via.bin.size;
        uint64_t v = 0;
        for (uint32_t i = n > 8 ? n - 8 : 0; i < n; i++)
            v = v << 8 | p[i];
        *out = v;
    } else {
        return bad(w, "%s is not an integer or bin", what);
    }
    return 0;
}

static int get_int(walk *w, const msgpack_object *o, const char *what, int64_t lo, uint64_t hi,
                   int64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= hi)
        *out = (int64_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= lo)
        *out = o->via.i64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
             o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return bad(w, "%s out of range", what);
    else
        return bad(w, "%s is not an integer", what);
    return 0;
}

enum { F_HASHES, F_PARENT, F_TOKENS, F_BSIZE, F_MEDIUM, F_GROUP, NF };
static const char *const field_name[NF] = {"block_hashes", "parent_block_hash", "token_ids",
                                           "block_size",   "medium",            "group_idx"};
/* Array-form index of each field per event type (after the tag at 0); 0: not a field of it. */
static const unsigned char field_pos[KVR_KV_EV_NTYPES][NF] = {
    [KVR_KV_EV_STORED] = {1, 2, 3, 4, 6, 9},
    [KVR_KV_EV_REMOVED] = {1, 0, 0, 0, 2, 3},
};
/* Shortest array form accepted: old vLLM sent BlockStored as tag + 5; tag + 4 is what the
 * router needs. BlockRemoved predates medium. */
static const uint32_t min_len[KVR_KV_EV_NTYPES] = {5, 2, 1};
static const char *const tag_name[KVR_KV_EV_NTYPES] = {"BlockStored", "BlockRemoved",
                                                       "AllBlocksCleared"};

static int tag_of(const msgpack_object *o)
{
    for (int t = 0; t < KVR_KV_EV_NTYPES; t++)
        if (is_str(o, tag_name[t]))
            return t;
    return -1;
}

static int read_fields(walk *w, kvr_kv_ev_type t, const msgpack_object *const f[NF])
{
    kvr_kv_event ev = {.type = t, .medium = KVR_KV_GPU, .group_idx = -1};
    if (field_pos[t][F_HASHES] && !f[F_HASHES])
        return bad(w, "%s without block_hashes", tag_name[t]);
    if (f[F_HASHES]) {
        const msgpack_object *a = f[F_HASHES];
        if (a->type != MSGPACK_OBJECT_ARRAY)
            return bad(w, "block_hashes is not an array");
        for (uint32_t i = 0; i < a->via.array.size; i++) {
            uint64_t h;
            if (get_hash(w, &a->via.array.ptr[i], "a block hash", &h) < 0)
                return -1;
            if (w->b)
                w->hashes[w->nhash + i] = h;
        }
        ev.nhashes = a->via.array.size;
        if (w->b && ev.nhashes)
            ev.hashes = w->hashes + w->nhash;
        w->nhash += ev.nhashes;
    }
    /* llm-d-inference-sim writes 0 for "no parent"; a zero fold of a bin means the same. */
    if (!is_nil(f[F_PARENT])) {
        if (get_hash(w, f[F_PARENT], "parent_block_hash", &ev.parent) < 0)
            return -1;
        ev.has_parent = ev.parent != 0;
    }
    if (!is_nil(f[F_TOKENS])) {
        const msgpack_object *a = f[F_TOKENS];
        if (a->type != MSGPACK_OBJECT_ARRAY)
            return bad(w, "token_ids is not an array");
        for (uint32_t i = 0; i < a->via.array.size; i++) {
            int64_t v;
            if (get_int(w, &a->via.array.ptr[i], "a token id", 0, UINT32_MAX, &v) < 0)
                return -1;
            if (w->b)
                w->tokens[w->ntok + i] = (uint32_t)v;
        }
        ev.ntokens = a->via.array.size;
        if (w->b && ev.ntokens)
            ev.tokens = w->tokens + w->ntok;
        w->ntok += ev.ntokens;
    }
    if (!is_nil(f[F_BSIZE])) {
        int64_t v;
        if (get_int(w, f[F_BSIZE], "block_size", 0, UINT32_MAX, &v) < 0)
            return -1;
        ev.block_size = (uint32_t)v;
    }
    /* Every tier off the GPU (CPU offload, LMCache, disk) is the lower tier for routing. */
    if (!is_nil(f[F_MEDIUM])) {
        const msgpack_object *m = f[F_MEDIUM];
        if (m->type != MSGPACK_OBJECT_STR)
            return bad(w, "medium is not a string");
        int gpu = m->via.str.size == 3 && strncasecmp(m->via.str.ptr, "GPU", 3) == 0;
        ev.medium = gpu ? KVR_KV_GPU : KVR_KV_CPU;
    }
    if (!is_nil(f[F_GROUP]) &&
        get_int(w, f[F_GROUP], "group_idx", INT64_MIN, INT64_MAX, &ev.group_idx) < 0)
        return -1;
    if (w->b)
        w->b->events[w->nev] = ev;
    w->nev++;
    return 0;
}

static int read_event(walk *w, const msgpack_object *o)
{
    const msgpack_object *f[NF] = {0};
    const msgpack_object *tag = NULL;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        if (o->via.array.size == 0)
            return bad(w, "empty event array");
        tag = &o->via.array.ptr[0];
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++)
            if (is_str(&o->via.map.ptr[i].key, "type"))
                tag = &o->via.map.ptr[i].val;
        if (!tag)
            return bad(w, "event map without \"type\"");
    } else {
        return bad(w, "event is not an array or map");
    }
    if (tag->type != MSGPACK_OBJECT_STR)
        return bad(w, "event tag is not a string");
    int t = tag_of(tag);
    if (t < 0) {
        w->unknown++; /* newer vLLM or another engine: skipping keeps the known events usable */
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        uint32_t n = o->via.array.size;
        if (n < min_len[t])
            return bad(w, "%s array has %u elements (fewer than %u)", tag_name[t], n, min_len[t]);
        for (int k = 0; k < NF; k++)
            if (field_pos[t][k] && field_pos[t][k] < n)
                f[k] = &o->via.array.ptr[field_pos[t][k]];
    } else {
        for (uint32_t i = 0; i < o->via.map.size; i++)
            for (int k = 0; k < NF; k++)
                if (field_pos[t][k] && is_str(&o->via.map.ptr[i].key, field_name[k]))
                    f[k] = &o->via.map.ptr[i].val;
    }
    return read_fields(w, (kvr_kv_ev_type)t, f);
}

static int read_batch(walk *w, const msgpack_object *o)
{
    const msgpack_object *ts = NULL, *events = NULL, *rank = NULL;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        if (o->via.array.size < 2)
            return bad(w, "batch array has %u elements (fewer than 2)", o->via.array.size);
        ts = &o->via.array.ptr[0];
        events = &o->via.array.ptr[1];
        rank = o->via.array.size > 2 ? &o->via.array.ptr[2] : NULL;
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (is_str(&kv->key, "ts"))
                ts = &kv->val;
            else if (is_str(&kv->key, "events"))
                events = &kv->val;
            else if (is_str(&kv->key, "data_parallel_rank"))
                rank = &kv->val;
        }
        if (!ts || !events)
            return bad(w, "batch map without \"%s\"", ts ? "events" : "ts");
    } else {
        return bad(w, "batch is not an array or map");
    }
    double t;
    if (ts->type == MSGPACK_OBJECT_FLOAT64 || ts->type == MSGPACK_OBJECT_FLOAT32)
        t = ts->via.f64;
    else if (ts->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        t = (double)ts->via.u64;
    else if (ts->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        t = (double)ts->via.i64;
    else
        return bad(w, "ts is not a number");
    int64_t r = -1;
    if (!is_nil(rank) && get_int(w, rank, "data_parallel_rank", INT64_MIN, INT64_MAX, &r) < 0)
        return -1;
    if (events->type != MSGPACK_OBJECT_ARRAY)
        return bad(w, "events is not an array");
    if (w->b) {
        w->b->ts = t;
        w->b->dp_rank = r;
    }
    for (uint32_t i = 0; i < events->via.array.size; i++) {
        w->at = i;
        if (read_event(w, &events->via.array.ptr[i]) < 0)
            return -1;
    }
    w->at = SIZE_MAX;
    return 0;
}

kvr_kv_batch *kvr_kv_decode(const void *payload, size_t len, char *err, size_t errlen)
{
    walk w = {.at = SIZE_MAX, .err = err, .errlen = errlen};
    if (err && errlen)
        err[0] = '\0';
    if (len == 0) {
        bad(&w, "empty payload");
        return NULL;
    }
    if (len > MAX_PAYLOAD) {
        bad(&w, "payload of %zu bytes (over 64 MiB)", len);
        return NULL;
    }
    const char *why = prescan(payload, len);
    if (why) {
        bad(&w, "%s", why);
        return NULL;
    }

    kvr_kv_batch *b = NULL;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&u, payload, len, &off);
    if (rc != MSGPACK_UNPACK_SUCCESS || off != len) {
        /* after the pre-pass, only depth (msgpack-c's 32-level stack) or memory can fail */
        if (rc == MSGPACK_UNPACK_NOMEM_ERROR)
            bad(&w, "msgpack nested deeper than 32 levels, or out of memory");
        else
            bad(&w, "msgpack-c rejected the payload (%d)", (int)rc);
        goto out;
    }
    if (read_batch(&w, &u.data) < 0)
        goto out;

    size_t nev = w.nev, nhash = w.nhash, ntok = w.ntok;
    b = malloc(sizeof(*b) + nev * sizeof(kvr_kv_event) + nhash * sizeof(uint64_t) +
               ntok * sizeof(uint32_t));
    if (!b) {
        bad(&w, "out of memory");
        goto out;
    }
    kvr_kv_event *events = (kvr_kv_event *)(b + 1);
    w = (walk){.b = b, .at = SIZE_MAX, .err = err, .errlen = errlen};
    w.hashes = (uint64_t *)(events + nev);
    w.tokens = (uint32_t *)(w.hashes + nhash);
    b->events = nev ? events : NULL;
    if (read_batch(&w, &u.data) < 0) {
        free(b); /* cannot happen: both walks run the same code over the same tree */
        b = NULL;
        goto out;
    }
    b->nevents = nev;
    b->unknown = w.unknown;
out:
    msgpack_unpacked_destroy(&u);
    return b;
}

void kvr_kv_batch_free(kvr_kv_batch *b)
{
    free(b);
}

const char *kvr_kv_ev_type_name(kvr_kv_ev_type t)
{
    return (unsigned)t < KVR_KV_EV_NTYPES ? tag_name[t] : "unknown";
}

const char *kvr_kv_medium_name(kvr_kv_medium m)
{
    return m == KVR_KV_GPU ? "GPU" : "CPU";
}
