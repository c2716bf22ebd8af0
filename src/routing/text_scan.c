/* Routing text from a body's scan. See text_scan.h; the framing is routing/keys.h's. */
/* XXH3_state_t on the stack: no allocation per lookup. */
#define XXH_STATIC_LINKING_ONLY
#include "routing/text_scan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "util/xxh.h"

#include "routing/keys.h"
#include "routing/text_writer.h"
#include "util/json_read.h"

/* Most bytes reserved for a text before it is written (kvr_route_text_scan()). */
#define TEXT_RESERVE_MAX (256u << 10)

/* One kept message text. Chained in its bucket and in the LRU list (head: most recent). */
typedef struct memo_ent {
    XXH128_hash_t key;     /* of the message's raw bytes, seeded */
    struct memo_ent *hnext; /* next in the bucket */
    struct memo_ent *prev, *next;
    size_t len;
    kvr_json_kind role;    /* its last "role" member's kind, for the scan (kvr_json_known) */
    int textless;          /* kept by kvr_text_cache_accept(): its bytes are known good, its
                              text was never built (len 0) */
    size_t next_len;       /* the raw length of the element that followed it when it was last
                              found (0: none seen), and that element's last NEXT_TAIL bytes: */
    unsigned char next_tail[16]; /* the guess for the element after it (memo_guess) */
    char text[];
} memo_ent;

/* Where a kept message seen starting with these bytes ended: a guess of the raw length of
 * an element beginning with the same SIG_BYTES bytes (kvr_json_known's guess). Overwritten by
 * any other start mapped here; only a hint, checked by the full hash. */
typedef struct memo_sig {
    uint64_t sig;          /* hash of the first SIG_BYTES raw bytes, seeded; 0 = empty */
    size_t len;            /* that message's raw bytes */
} memo_sig;
#define SIG_BYTES 128       /* tool calls and their results share their first ~64 bytes */
#define SIG_PER_BUCKET 4    /* guesses kept per text bucket: room for the texts' starts */

struct kvr_text_cache {
    struct {
        XXH128_hash_t key; /* of the raw tools and functions spans */
        char *text;        /* their tools section (NULL when empty) */
        int valid;         /* 0: a free entry */
        size_t len;
        uint64_t used;     /* tick of the last use, for LRU */
    } e[KVR_TEXT_CACHE_ENTRIES];
    uint64_t tick, hits, misses;
    /* message texts */
    memo_ent **bucket; /* NULL when no budget */
    size_t mask;       /* buckets - 1 (a power of two) */
    memo_sig *sig;     /* SIG_PER_BUCKET per bucket, direct-mapped by the start's hash */
    const char *guess_p; /* the last guess's start and answer: find() asked about exactly */
    size_t guess_n;      /* those bytes needs not remember them again */
    memo_ent *prev;      /* the entry the last find() hit, ending at prev_end, while the */
    const char *prev_end; /* eviction count is prev_ev (else gone): the element after it is */
    uint64_t prev_ev;    /* guessed to be the one that followed it last time */
    memo_ent *head, *tail;
    size_t bytes, max_bytes, min_raw;
    uint64_t seed, mhits, mmisses;
    unsigned char secret[XXH3_SECRET_DEFAULT_SIZE]; /* XXH3's for `seed` (key_of) */
    uint64_t evictions;    /* messages' texts dropped so far: a scan's hit is still there
                              when its text is built if none was dropped meanwhile */
};

/* kvr_json_elem.keyed as memo_known sets it: key = the bytes' hash (a miss), or the entry
 * found and the eviction count then (a hit). */
#define KEYED_HASH 1
#define KEYED_ENTRY 2

/* Budget bytes per bucket: texts are ~1 KB and up, so chains stay short. */
#define MEMO_BYTES_PER_BUCKET 1024u
#define MEMO_BUCKETS_MAX (1u << 22)

kvr_text_cache *kvr_text_cache_new(size_t memo_bytes, size_t memo_min)
{
    kvr_text_cache *c = calloc(1, sizeof(kvr_text_cache));
    if (!c || !memo_bytes)
        return c;
    size_t n = 64;
    while (n < MEMO_BUCKETS_MAX && n * MEMO_BYTES_PER_BUCKET < memo_bytes)
        n *= 2;
    if (!(c->bucket = calloc(n, sizeof(*c->bucket))) ||
        !(c->sig = calloc(n * SIG_PER_BUCKET, sizeof(*c->sig)))) {
        free(c->bucket);
        free(c);
        return NULL;
    }
    c->mask = n - 1;
    c->max_bytes = memo_bytes;
    c->min_raw = memo_min;
    /* Seeded so no client can aim two messages at one key; a failed getrandom only makes
     * that easier, never wrong. */
    if (getrandom(&c->seed, sizeof(c->seed), GRND_NONBLOCK) != (ssize_t)sizeof(c->seed))
        c->seed = (uint64_t)(uintptr_t)c ^ 0x9e3779b97f4a7c15ull;
    XXH3_generateSecret_fromSeed(c->secret, c->seed);
    return c;
}

/* A message's key: the seeded hash of its raw bytes. */
static XXH128_hash_t key_of(const kvr_text_cache *c, const char *p, size_t n)
{
    return kvr_xxh3_128_seed_secret(p, n, c->seed, c->secret);
}

void kvr_text_cache_free(kvr_text_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < KVR_TEXT_CACHE_ENTRIES; i++)
        free(c->e[i].text);
    for (memo_ent *e = c->head, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    free(c->bucket);
    free(c->sig);
    free(c);
}

void kvr_text_cache_stats(const kvr_text_cache *c, uint64_t *hits, uint64_t *misses)
{
    *hits = c ? c->hits : 0;
    *misses = c ? c->misses : 0;
}

void kvr_text_cache_memo_stats(const kvr_text_cache *c, uint64_t *hits, uint64_t *misses,
                               size_t *bytes)
{
    *hits = c ? c->mhits : 0;
    *misses = c ? c->mmisses : 0;
    *bytes = c ? c->bytes : 0;
}

static size_t memo_cost(size_t len)
{
    return sizeof(memo_ent) + len;
}

static void lru_unlink(kvr_text_cache *c, memo_ent *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
}

static void lru_push(kvr_text_cache *c, memo_ent *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    else
        c->tail = e;
    c->head = e;
}

static memo_ent *memo_peek(const kvr_text_cache *c, XXH128_hash_t key)
{
    for (memo_ent *e = c->bucket[key.low64 & c->mask]; e; e = e->hnext)
        if (XXH128_isEqual(e->key, key))
            return e;
    return NULL;
}

static void memo_touch(kvr_text_cache *c, memo_ent *e)
{
    if (c->head != e) {
        lru_unlink(c, e);
        lru_push(c, e);
    }
}

static memo_ent *memo_find(kvr_text_cache *c, XXH128_hash_t key)
{
    memo_ent *e = memo_peek(c, key);
    if (e)
        memo_touch(c, e);
    return e;
}

static memo_sig *sig_slot(const kvr_text_cache *c, const char *p, uint64_t *sig)
{
    *sig = XXH3_64bits_withSeed(p, SIG_BYTES, c->seed) | 1; /* never 0, the empty mark */
    return &c->sig[(*sig >> 7) & (c->mask * SIG_PER_BUCKET + SIG_PER_BUCKET - 1)];
}

/* Remembers that a kept message's raw bytes [p, p + n) end n bytes after their start. */
static void sig_put(kvr_text_cache *c, const char *p, size_t n)
{
    if (n < SIG_BYTES)
        return;
    uint64_t sig;
    memo_sig *s = sig_slot(c, p, &sig);
    s->sig = sig;
    s->len = n;
}

/* Bytes a conversation's next element is checked by before its length is guessed from its
 * predecessor: its end, where messages differ (their starts, `{"role":"user",...`, do not). */
#define NEXT_TAIL 16
/* Most bytes between two elements of an array (a comma and whitespace) for them to count as
 * neighbours. */
#define NEXT_GAP 8

/* The entry found just before p (its element ended at most NEXT_GAP bytes earlier), if it is
 * still kept. */
static memo_ent *prev_of(const kvr_text_cache *c, const char *p)
{
    if (!c->prev || c->prev_ev != c->evictions || p < c->prev_end ||
        (size_t)(p - c->prev_end) > NEXT_GAP)
        return NULL;
    return c->prev;
}

/* kvr_json_known's guess: the raw length of the element that followed the previous one last
 * time, when its last bytes match (a conversation's next turn resends its messages in
 * order); else of the kept message last seen starting with the same bytes. */
static size_t memo_guess(void *ctx, const char *p, size_t avail)
{
    kvr_text_cache *c = ctx;
    size_t n = 0;
    const memo_ent *pe = prev_of(c, p);
    if (pe && pe->next_len >= NEXT_TAIL && pe->next_len <= avail &&
        !memcmp(p + pe->next_len - NEXT_TAIL, pe->next_tail, NEXT_TAIL)) {
        n = pe->next_len;
    } else if (avail >= SIG_BYTES) {
        uint64_t sig;
        const memo_sig *s = sig_slot(c, p, &sig);
        n = s->sig == sig && s->len <= avail ? s->len : 0;
    }
    c->guess_p = p;
    c->guess_n = n;
    return n;
}

/* kvr_json_known's find: a message is kept only once its body was accepted, so bytes found
 * here are a message the scan accepted. The hash goes back with the element, for the text's
 * lookup (put_message_memo). A message found after its end was located (no guess, or a wrong
 * one) is remembered for the next guess. */
static int memo_known(void *ctx, const char *p, size_t n, kvr_json_elem *el)
{
    kvr_text_cache *c = ctx;
    XXH128_hash_t key = key_of(c, p, n);
    memo_ent *e = memo_peek(c, key);
    /* A guessed length that misses may be wrong: only a hit or a located element (asked
     * without a guess, or after a wrong one) is where the next one starts. */
    int placed = e || p != c->guess_p || n != c->guess_n;
    memo_ent *pe = placed ? prev_of(c, p) : NULL;
    if (pe && n >= NEXT_TAIL) {
        pe->next_len = n;
        memcpy(pe->next_tail, p + n - NEXT_TAIL, NEXT_TAIL);
    }
    if (placed) {
        c->prev = e;
        c->prev_end = p + n;
        c->prev_ev = c->evictions;
    }
    if (!e) {
        el->key[0] = key.low64;
        el->key[1] = key.high64;
        el->keyed = KEYED_HASH;
        return 0;
    }
    /* The entry itself goes back: the text's build takes it without a second lookup. */
    el->key[0] = (uint64_t)(uintptr_t)e;
    el->key[1] = c->evictions;
    el->keyed = KEYED_ENTRY;
    el->role = e->role;
    /* The scan guesses right before it asks: a hit on the guessed bytes is remembered. */
    if (p != c->guess_p || n != c->guess_n)
        sig_put(c, p, n);
    c->guess_p = NULL;
    return 1;
}

int kvr_text_cache_known(kvr_text_cache *c, kvr_json_known *out)
{
    if (!c || !c->bucket)
        return 0;
    *out = (kvr_json_known){.find = memo_known, .guess = memo_guess, .ctx = c,
                            .min = c->min_raw};
    return 1;
}

/* Drops entry `e`. The eviction count moves, so no scan's hit on it is used afterwards. */
static void memo_drop(kvr_text_cache *c, memo_ent *e)
{
    memo_ent **pp = &c->bucket[e->key.low64 & c->mask];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(c, e);
    c->bytes -= memo_cost(e->len);
    c->evictions++;
    free(e);
}

static void memo_evict_tail(kvr_text_cache *c)
{
    memo_drop(c, c->tail);
}

/* Keeps `text` under `key` (absent: memo_find() just missed it). A text above a sixteenth of
 * the budget is not kept: one huge message would flush every other conversation's. Out of
 * memory keeps nothing (the text was built anyway). */
/* Returns 1 when the text is kept, 0 when it is too large or memory ran out. */
static int memo_add(kvr_text_cache *c, XXH128_hash_t key, const char *text, size_t len,
                    kvr_json_kind role)
{
    if (memo_cost(len) > c->max_bytes / 16)
        return 0;
    memo_ent *e = malloc(memo_cost(len));
    if (!e)
        return 0;
    e->key = key;
    e->len = len;
    e->role = role;
    e->textless = !text;
    e->next_len = 0;
    if (len)
        memcpy(e->text, text, len);
    while (c->tail && c->bytes + memo_cost(len) > c->max_bytes)
        memo_evict_tail(c);
    memo_ent **b = &c->bucket[key.low64 & c->mask];
    e->hnext = *b;
    *b = e;
    lru_push(c, e);
    c->bytes += memo_cost(len);
    return 1;
}

/* A walk of one body: the writer and the body. */
typedef struct ctx {
    kvr_text_writer w;
    const char *buf;
    uint64_t id;      /* the text's id so far (id_fold) */
    int want_id;      /* the id is asked for (and the cache has the messages' hashes) */
} ctx;

/* Folds one input of the text (a 128-bit digest of the bytes it comes from) into the text's
 * id: each step an invertible mix of the state, so inputs in another order or split another
 * way give another id. */
static inline void id_fold(ctx *c, uint64_t lo, uint64_t hi)
{
    c->id = kvr_mix64(kvr_mix64(c->id ^ lo) ^ hi);
}

/* id_fold() of raw bytes the scan did not hash (short messages, items that are no object). */
static void id_fold_bytes(ctx *c, const char *p, size_t n)
{
    id_fold(c, XXH3_64bits_withSeed(p, n, 0x6b767274657874ull), n);
}

static int done(const ctx *c)
{
    return c->w.cut || c->w.oom;
}

/* A string span's decoded bytes. */
static void put_string(ctx *c, const kvr_json_span *s)
{
    if (!s->escaped) {
        kvr_text_put(&c->w, c->buf + s->off + 1, s->len - 2);
        return;
    }
    if (done(c))
        return;
    /* Decoded straight into the text: decoded bytes never outnumber the quoted ones, and the
     * 16 more leave room for the decoder's wide stores. The text's cap cuts as
     * kvr_text_put does. */
    kvr_buf *b = c->w.b;
    if (kvr_buf_reserve(b, s->len + 16) < 0) {
        c->w.oom = 1;
        return;
    }
    size_t room = b->alloc - b->len - 1;
    size_t n = kvr_json_span_string(c->buf, s, b->data + b->len, room);
    size_t keep = n < room ? n : room;
    if (b->cap && keep > b->cap - b->len)
        keep = b->cap - b->len;
    b->len += keep;
    b->data[b->len] = '\0';
    if (keep < n)
        c->w.cut = 1;
}

/* The value of a span as a jansson value (the body was scanned: only memory can fail).
 * Containers (a data: URL part can be megabytes) go through kvr_json_read, several times
 * faster than json_loadb and building the same value; it takes no scalars, which are small. */
static json_t *read_span(const char *buf, const kvr_json_span *v)
{
    json_error_t e;
    if (v->kind == KVR_JSON_OBJECT || v->kind == KVR_JSON_ARRAY)
        return kvr_json_read(buf + v->off, v->len, NULL);
    return json_loadb(buf + v->off, v->len, JSON_DECODE_ANY, &e);
}

static json_t *load(ctx *c, const kvr_json_span *v)
{
    json_t *j = read_span(c->buf, v);
    if (!j)
        c->w.oom = 1;
    return j;
}

/* `put` (kvr_text_canon or kvr_text_digest_field) on the value of span `v`, read with
 * jansson: the rare values whose text is their canonical JSON. */
static void put_read(ctx *c, const kvr_json_span *v,
                     void (*put)(kvr_text_writer *, const json_t *))
{
    if (done(c))
        return;
    json_t *j = load(c, v);
    if (j)
        put(&c->w, j);
    json_decref(j);
}

static void put_canon(ctx *c, const kvr_json_span *v)
{
    put_read(c, v, kvr_text_canon);
}

static void put_digest(ctx *c, const kvr_json_span *v)
{
    put_read(c, v, kvr_text_digest_field);
}

/* A value that should be a string (name, arguments): its bytes, else its canonical JSON. */
static void put_text_or_canon(ctx *c, const kvr_json_span *v)
{
    if (v->kind == KVR_JSON_STRING)
        put_string(c, v);
    else if (v->kind != KVR_JSON_ABSENT && v->kind != KVR_JSON_NULL)
        put_canon(c, v);
}

/* A non-empty string as a 'c' field (a string span of 2 bytes is ""; an escape always
 * decodes to at least one byte). */
static void put_text_field(ctx *c, const kvr_json_span *s)
{
    if (s->len > 2) {
        kvr_text_field(&c->w, 'c');
        put_string(c, s);
    }
}

static int is_text_part_type(const ctx *c, const kvr_json_span *t)
{
    return kvr_json_span_is(c->buf, t, "text") || kvr_json_span_is(c->buf, t, "input_text") ||
           kvr_json_span_is(c->buf, t, "output_text");
}

/* Content: a string, or parts in order; text parts as 'c', the rest as digests. */
static void put_content(ctx *c, const kvr_json_span *content)
{
    if (content->kind == KVR_JSON_ABSENT || content->kind == KVR_JSON_NULL)
        return;
    if (content->kind == KVR_JSON_STRING) {
        put_text_field(c, content);
        return;
    }
    if (content->kind != KVR_JSON_ARRAY) {
        put_digest(c, content);
        return;
    }
    static const char *const names[] = {"type", "text"};
    kvr_json_iter it, in;
    kvr_json_span part, m[2];
    kvr_json_iter_init(&it, c->buf, content);
    while (!done(c) && kvr_json_iter_descend(&it, &part, &in)) {
        if (part.kind == KVR_JSON_STRING) {
            put_text_field(c, &part);
            continue;
        }
        kvr_json_iter_members(&in, names, 2, m); /* none when no object */
        if (part.kind == KVR_JSON_OBJECT)
            part.len = it.pos - part.off; /* known now that `in` ended */
        if (m[1].kind == KVR_JSON_STRING && is_text_part_type(c, &m[0])) {
            put_text_field(c, &m[1]);
            continue;
        }
        put_digest(c, &part);
    }
}

/* A tool call or legacy function call: the object holding name and arguments. */
static void put_call(ctx *c, const kvr_json_span *fn)
{
    static const char *const names[] = {"name", "arguments"};
    kvr_json_span m[2];
    kvr_json_span_members(c->buf, fn, names, 2, m);
    kvr_text_field(&c->w, 'f');
    put_text_or_canon(c, &m[0]);
    kvr_text_field(&c->w, 'a');
    put_text_or_canon(c, &m[1]);
}

enum { M_ROLE, M_NAME, M_TOOL_CALL_ID, M_CONTENT, M_TOOL_CALLS, M_FUNCTION_CALL, M_COUNT };

/* A message: `msg` as kvr_json_iter_descend() gave it, `in` its members when an object. */
static void put_message(ctx *c, const kvr_json_span *msg, kvr_json_iter *in)
{
    static const char *const names[M_COUNT] = {/* in the enum's order */
                                               "role",    "name",       "tool_call_id",
                                               "content", "tool_calls", "function_call"};
    if (msg->kind != KVR_JSON_OBJECT) {
        kvr_text_rec_start_s(&c->w, "#item");
        put_digest(c, msg);
        kvr_text_rec_end(&c->w);
        return;
    }
    kvr_json_span m[M_COUNT];
    kvr_json_iter_members(in, names, M_COUNT, m);
    kvr_text_putc(&c->w, KVR_TEXT_RS);
    if (m[M_ROLE].kind == KVR_JSON_STRING)
        put_string(c, &m[M_ROLE]);
    else if (m[M_ROLE].kind != KVR_JSON_ABSENT)
        put_canon(c, &m[M_ROLE]);
    if (m[M_NAME].kind == KVR_JSON_STRING) {
        kvr_text_field(&c->w, 'n');
        put_string(c, &m[M_NAME]);
    }
    if (m[M_TOOL_CALL_ID].kind == KVR_JSON_STRING) {
        kvr_text_field(&c->w, 'i');
        put_string(c, &m[M_TOOL_CALL_ID]);
    }
    put_content(c, &m[M_CONTENT]);
    static const char *const fn_name = "function";
    kvr_json_iter it = {0}, tin; /* a zeroed iterator has nothing to give */
    kvr_json_span tc, fn;
    if (m[M_TOOL_CALLS].kind == KVR_JSON_ARRAY)
        kvr_json_iter_init(&it, c->buf, &m[M_TOOL_CALLS]);
    while (!done(c) && kvr_json_iter_descend(&it, &tc, &tin)) {
        kvr_json_iter_members(&tin, &fn_name, 1, &fn);
        if (tc.kind == KVR_JSON_OBJECT)
            tc.len = it.pos - tc.off;
        if (fn.kind == KVR_JSON_OBJECT)
            put_call(c, &fn);
        else
            put_digest(c, &tc);
    }
    if (m[M_FUNCTION_CALL].kind == KVR_JSON_OBJECT)
        put_call(c, &m[M_FUNCTION_CALL]);
    kvr_text_rec_end(&c->w);
}

/* A message whose span `msg` is known (placed by the scan, `el` its element then, else NULL:
 * found by kvr_json_iter_next()): its kept text when the cache has it, else built and kept
 * (when long enough, and not cut: a cut text is no message's). Without a cache for
 * messages, built. */
static void put_message_memo(ctx *c, const kvr_json_span *msg, const kvr_json_elem *el,
                             kvr_text_cache *cache)
{
    kvr_json_iter in = {0};
    if (!cache || !cache->bucket || msg->kind != KVR_JSON_OBJECT ||
        msg->len < cache->min_raw) {
        if (c->want_id)
            id_fold_bytes(c, c->buf + msg->off, msg->len);
        kvr_json_iter_init(&in, c->buf, msg);
        put_message(c, msg, &in);
        return;
    }
    XXH128_hash_t key; /* the scan's, when it hashed these bytes (kvr_text_cache_known) */
    memo_ent *e;
    if (el && el->keyed == KEYED_ENTRY && el->key[1] == cache->evictions) {
        e = (memo_ent *)(uintptr_t)el->key[0];
        key = e->key;
        memo_touch(cache, e);
    } else {
        if (el && el->keyed == KEYED_HASH) {
            key.low64 = el->key[0];
            key.high64 = el->key[1];
        } else {
            key = key_of(cache, c->buf + msg->off, msg->len);
        }
        e = memo_find(cache, key);
    }
    id_fold(c, key.low64, key.high64);
    if (e && !e->textless) {
        cache->mhits++;
        kvr_text_put(&c->w, e->text, e->len);
        return;
    }
    if (e) /* accepted by a route that reads no text: built now and kept with it below */
        memo_drop(cache, e);
    cache->mmisses++;
    size_t start = c->w.b->len;
    kvr_json_iter_init(&in, c->buf, msg);
    put_message(c, msg, &in);
    if (done(c))
        return;
    kvr_json_span r;
    if (!el)
        kvr_json_span_member(c->buf, msg, "role", &r);
    if (memo_add(cache, key, c->w.b->data + start, c->w.b->len - start,
                 el ? el->role : r.kind))
        sig_put(cache, c->buf + msg->off, msg->len);
}

void kvr_text_cache_accept(kvr_text_cache *c, const char *buf, const kvr_json_elem *el,
                           size_t n)
{
    if (!c || !c->bucket)
        return;
    for (size_t i = 0; i < n; i++) {
        if (el[i].keyed == KEYED_ENTRY && el[i].key[1] == c->evictions) {
            memo_touch(c, (memo_ent *)(uintptr_t)el[i].key[0]);
            continue;
        }
        if (el[i].keyed != KEYED_HASH)
            continue; /* not offered to the memo (short, no object), or a stale hit */
        XXH128_hash_t key = {.low64 = el[i].key[0], .high64 = el[i].key[1]};
        if (!memo_peek(c, key) && memo_add(c, key, NULL, 0, el[i].role))
            sig_put(c, buf + el[i].off, el[i].len);
    }
}

/* ---- tools ---------------------------------------------------------------------------- */

/* The tools section built by the tree code (routing/keys.c sorts by name, ties by canonical
 * JSON): a chat body holding only `tools` and `functions` has exactly that text. Only the
 * arrays count (anything else adds no tool), so only they are read. Uncapped. Returns 0 or
 * -1 (memory). */
static int tools_text(const char *buf, const kvr_json_span *tools, const kvr_json_span *fns,
                      kvr_buf *out)
{
    json_t *body = json_object();
    int rc = body ? 0 : -1;
    const kvr_json_span *spans[2] = {tools, fns};
    static const char *const keys[2] = {"tools", "functions"};
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (spans[i]->kind != KVR_JSON_ARRAY)
            continue;
        json_t *v = read_span(buf, spans[i]);
        if (!v || json_object_set_new(body, keys[i], v) < 0)
            rc = -1;
    }
    if (rc == 0 && kvr_route_text_build(body, KVR_ROUTE_CHAT, out) != 0)
        rc = -1; /* uncapped: only memory can fail */
    json_decref(body);
    return rc;
}

static void put_tools(ctx *c, const kvr_json_span *tools, const kvr_json_span *fns,
                      kvr_text_cache *cache)
{
    if (tools->kind != KVR_JSON_ARRAY && fns->kind != KVR_JSON_ARRAY)
        return;
    if ((tools->kind != KVR_JSON_ARRAY || tools->len == 2) &&
        (fns->kind != KVR_JSON_ARRAY || fns->len == 2))
        return; /* "[]": no tool (the scanner's spans of arrays end at their bracket) */
    XXH128_hash_t key = {0, 0};
    if (cache) {
        /* The two spans with their kinds and lengths, so no two pairs hash alike by how
         * their bytes split. */
        XXH3_state_t st;
        uint64_t hdr[4] = {tools->kind, tools->kind == KVR_JSON_ARRAY ? tools->len : 0,
                           fns->kind, fns->kind == KVR_JSON_ARRAY ? fns->len : 0};
        XXH3_128bits_reset(&st);
        XXH3_128bits_update(&st, hdr, sizeof(hdr));
        if (tools->kind == KVR_JSON_ARRAY)
            XXH3_128bits_update(&st, c->buf + tools->off, tools->len);
        if (fns->kind == KVR_JSON_ARRAY)
            XXH3_128bits_update(&st, c->buf + fns->off, fns->len);
        key = XXH3_128bits_digest(&st);
        id_fold(c, key.low64, key.high64);
        cache->tick++;
        for (size_t i = 0; i < KVR_TEXT_CACHE_ENTRIES; i++)
            if (cache->e[i].valid && XXH128_isEqual(cache->e[i].key, key)) {
                cache->e[i].used = cache->tick;
                cache->hits++;
                kvr_text_put(&c->w, cache->e[i].text, cache->e[i].len);
                return;
            }
        cache->misses++;
    }
    kvr_buf t;
    kvr_buf_init(&t, 0);
    if (tools_text(c->buf, tools, fns, &t) < 0) {
        kvr_buf_free(&t);
        c->w.oom = 1;
        return;
    }
    kvr_text_put(&c->w, t.data, t.len);
    if (!cache || t.len > KVR_TEXT_CACHE_MAX_BYTES) {
        kvr_buf_free(&t);
        return;
    }
    size_t victim = 0; /* a free entry, else the least recently used */
    for (size_t i = 0; i < KVR_TEXT_CACHE_ENTRIES; i++) {
        if (!cache->e[i].valid) {
            victim = i;
            break;
        }
        if (cache->e[i].used < cache->e[victim].used)
            victim = i;
    }
    free(cache->e[victim].text);
    cache->e[victim].key = key;
    cache->e[victim].text = t.data; /* the buffer's bytes change hands */
    cache->e[victim].len = t.len;
    cache->e[victim].valid = 1;
    cache->e[victim].used = cache->tick;
}

/* ---- entry points --------------------------------------------------------------------- */

static int finish(ctx *c)
{
    return c->w.oom ? -1 : c->w.cut ? 1 : 0;
}

int kvr_route_text_scan(const char *buf, const kvr_json_span *tools,
                        const kvr_json_span *functions, const kvr_json_span *messages,
                        const kvr_json_elem *msgs, size_t nmsgs, kvr_text_cache *cache,
                        kvr_buf *out)
{
    return kvr_route_text_scan_id(buf, tools, functions, messages, msgs, nmsgs, cache, out,
                                  NULL);
}

int kvr_route_text_scan_id(const char *buf, const kvr_json_span *tools,
                           const kvr_json_span *functions, const kvr_json_span *messages,
                           const kvr_json_elem *msgs, size_t nmsgs, kvr_text_cache *cache,
                           kvr_buf *out, uint64_t *id)
{
    ctx c = {.w = {.b = out}, .buf = buf, .id = 0x6b76726f75746531ull,
             .want_id = id && cache && cache->bucket};
    if (id)
        *id = 0;
    /* The text is about as long as the messages as written: one allocation up front rather
     * than a copy per doubling. Bounded: a message holding a large image is a short text (a
     * digest), and the text lives as long as its request. */
    size_t hint = messages->kind == KVR_JSON_ARRAY ? messages->len : 0;
    if (hint && kvr_buf_reserve(out, hint < TEXT_RESERVE_MAX ? hint : TEXT_RESERVE_MAX) < 0)
        return -1;
    put_tools(&c, tools, functions, cache);
    kvr_json_iter it = {0}, in; /* a zeroed iterator has nothing to give */
    kvr_json_span m;
    if (messages->kind == KVR_JSON_ARRAY) /* anything else: no message, as the tree */
        kvr_json_iter_init(&it, buf, messages);
    else
        nmsgs = 0;
    if (nmsgs > messages->count)
        nmsgs = messages->count;
    if (msgs && nmsgs) {
        /* The messages the scan placed: none is walked to. The walk below goes on after the
         * last of them (a valid array: its separator, or its end). */
        for (size_t i = 0; i < nmsgs && !done(&c); i++) {
            m = (kvr_json_span){.off = msgs[i].off, .len = msgs[i].len, .kind = msgs[i].kind};
            put_message_memo(&c, &m, &msgs[i], cache);
        }
        it.pos = msgs[nmsgs - 1].off + msgs[nmsgs - 1].len;
    }
    if (cache && cache->bucket) {
        while (!done(&c) && kvr_json_iter_next(&it, NULL, &m))
            put_message_memo(&c, &m, NULL, cache);
        /* Every message and the tools section went into the id (a cut text stops early, at
         * the same point for the same body and cap). An id of 0 means none. */
        if (c.want_id && !c.w.oom) {
            id_fold(&c, messages->count, out->len);
            *id = c.id ? c.id : 1;
        }
        return finish(&c);
    }
    while (!done(&c) && kvr_json_iter_descend(&it, &m, &in)) {
        put_message(&c, &m, &in);
        if (in.parent) /* `in` not walked to its end (cannot happen): leave the walk */
            break;
    }
    return finish(&c);
}

int kvr_route_text_scan_prompt(const char *buf, const kvr_json_span *prompt, kvr_buf *out)
{
    ctx c = {.w = {.b = out}, .buf = buf};
    if (prompt->kind == KVR_JSON_STRING) {
        put_string(&c, prompt);
        return finish(&c);
    }
    if (prompt->kind == KVR_JSON_ABSENT || prompt->kind == KVR_JSON_NULL)
        return finish(&c);
    /* Token ids and batches: the tree code on the prompt alone (the text is the prompt's). */
    json_t *v = load(&c, prompt), *body = v ? json_object() : NULL;
    if (body && json_object_set(body, "prompt", v) == 0) {
        int rc = kvr_route_text_build(body, KVR_ROUTE_COMPLETIONS, out);
        c.w.oom = rc < 0;
        c.w.cut = rc == 1;
    } else {
        c.w.oom = 1;
    }
    json_decref(body);
    json_decref(v);
    return finish(&c);
}
