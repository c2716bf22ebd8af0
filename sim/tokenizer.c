/* Deterministic pseudo-tokenizer: pre-tokenization after GPT-2/Llama 3's regex, fixed-size
 * pieces, hashed ids. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* Longest piece of each class, in bytes. Chosen so English prose averages ~4 bytes per token
 * (tests/unit/test_sim_tokenizer.c measures it), like Llama 3's BPE on English. */
#define WORD_PIECE 7
#define PUNCT_PIECE 3
#define SPACE_PIECE 8
#define DIGIT_PIECE 3 /* Llama 3 splits numbers into groups of up to 3 digits */

enum { C_OTHER, C_LETTER, C_DIGIT, C_SPACE };
static unsigned char cls[256];
static int cls_ready;

static void init_cls(void)
{
    for (int c = 0; c < 256; c++) {
        unsigned char k = C_OTHER;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80)
            k = C_LETTER; /* UTF-8 bytes count as letters, as \p{L} would for most scripts */
        else if (c >= '0' && c <= '9')
            k = C_DIGIT;
        else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')
            k = C_SPACE;
        cls[c] = k;
    }
    cls_ready = 1;
}

void kvr_sim_toks_init(kvr_sim_toks *t, size_t max)
{
    memset(t, 0, sizeof(*t));
    t->max = max;
}

void kvr_sim_toks_push(kvr_sim_toks *t, uint32_t id)
{
    t->total++;
    if (t->oom || (t->max && t->len >= t->max))
        return;
    if (t->len == t->cap) {
        size_t n = t->cap ? t->cap * 2 : 1024;
        if (t->max && n > t->max)
            n = t->max;
        uint32_t *p = realloc(t->ids, n * sizeof(*p));
        if (!p) {
            t->oom = 1;
            return;
        }
        t->ids = p;
        t->cap = n;
    }
    t->ids[t->len++] = id;
}

void kvr_sim_toks_append(kvr_sim_toks *t, const uint32_t *ids, size_t n)
{
    size_t room = n;
    if (t->max)
        room = t->len >= t->max ? 0 : (t->max - t->len < n ? t->max - t->len : n);
    if (t->oom)
        room = 0;
    if (room && t->len + room > t->cap) {
        size_t c = t->cap ? t->cap : 1024;
        while (c < t->len + room)
            c *= 2;
        if (t->max && c > t->max)
            c = t->max;
        uint32_t *p = realloc(t->ids, c * sizeof(*p));
        if (!p) {
            t->oom = 1;
            room = 0;
        } else {
            t->ids = p;
            t->cap = c;
        }
    }
    if (room)
        memcpy(t->ids + t->len, ids, room * sizeof(*ids));
    t->len += room;
    t->total += n;
}

void kvr_sim_toks_free(kvr_sim_toks *t)
{
    free(t->ids);
    size_t max = t->max;
    kvr_sim_toks_init(t, max);
}

uint32_t *kvr_sim_toks_take(kvr_sim_toks *t)
{
    uint32_t *p = t->ids;
    t->ids = NULL;
    t->len = t->cap = t->total = 0;
    return p;
}

static inline uint32_t id_of(uint64_t v, size_t len)
{
    /* splitmix64's finaliser over bytes and length: cheap and well mixed for tiny inputs. */
    uint64_t z = v ^ ((uint64_t)len * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(((z >> 32) * KVR_SIM_TOK_FIRST_SPECIAL) >> 32);
}

/* The piece's bytes as a little-endian integer (the definition of a piece's value). */
static inline uint64_t load_slow(const unsigned char *p, size_t len)
{
    uint64_t v = 0;
    for (size_t k = 0; k < len && k < 8; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

uint32_t kvr_sim_piece_id(const char *piece, size_t len)
{
    return id_of(load_slow((const unsigned char *)piece, len), len);
}

/* Same value as load_slow(), with one unaligned load when 8 bytes are readable. */
static inline uint64_t load(const char *p, size_t len, size_t avail)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (avail >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        return len >= 8 ? v : v & ((1ull << (8 * len)) - 1);
    }
#else
    (void)avail;
#endif
    return load_slow((const unsigned char *)p, len);
}

/* Ids are produced into a small local batch and appended in bulk. */
typedef struct batch {
    uint32_t ids[256];
    size_t n;
    kvr_sim_toks *out;
} batch;

static inline void flush(batch *b)
{
    kvr_sim_toks_append(b->out, b->ids, b->n);
    b->n = 0;
}

/* Emits [p, p+n) as pieces of at most `k` bytes; `avail` bytes are readable from p. */
static inline void emit_run(batch *b, const char *p, size_t n, size_t k, size_t avail)
{
    while (n) {
        size_t m = n < k ? n : k;
        if (b->n == sizeof(b->ids) / sizeof(*b->ids))
            flush(b);
        b->ids[b->n++] = id_of(load(p, m, avail), m);
        p += m;
        n -= m;
        avail -= m;
    }
}

void kvr_sim_tokenize(kvr_sim_toks *out, const char *text, size_t len)
{
    if (!cls_ready)
        init_cls();
    batch bt;
    bt.n = 0;
    bt.out = out;
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        size_t start = i;
        int c = cls[s[i]];
        if (c == C_SPACE) {
            size_t j = i;
            while (j < len && cls[s[j]] == C_SPACE)
                j++;
            if (j < len && s[j - 1] == ' ' && cls[s[j]] != C_DIGIT) {
                /* GPT-2's `\s+(?!\S)`: the last space of a run before a word or punctuation
                 * belongs to that word; the rest of the run is whitespace pieces. */
                if (j - 1 > start)
                    emit_run(&bt, text + start, j - 1 - start, SPACE_PIECE, len - start);
                start = j - 1;
                c = cls[s[j]];
                i = j + 1;
            } else {
                emit_run(&bt, text + start, j - start, SPACE_PIECE, len - start);
                i = j;
                continue;
            }
        } else {
            i++;
        }
        /* [start, i) holds an optional leading space and the first byte of class c. */
        if (c == C_LETTER) {
            while (i < len && cls[s[i]] == C_LETTER)
                i++;
            emit_run(&bt, text + start, i - start, WORD_PIECE, len - start);
        } else if (c == C_DIGIT) {
            while (i < len && cls[s[i]] == C_DIGIT)
                i++;
            emit_run(&bt, text + start, i - start, DIGIT_PIECE, len - start);
        } else {
            while (i < len && cls[s[i]] == C_OTHER)
                i++;
            emit_run(&bt, text + start, i - start, PUNCT_PIECE, len - start);
        }
    }
    flush(&bt);
}

/* Short words only: with a leading space each is one piece (<= WORD_PIECE bytes). */
static const char *const words[64] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "this",  "are",   "or",    "from",
    "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",   "were",  "their",
    "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",  "if",    "more",
    "when",  "will",  "would", "who",   "so",    "no",    "cache", "block", "token", "route",
    "fleet", "model", "hot",   "warm", "cold",  "queue", "batch", "step",  "hit",   "miss",
    "key",   "node",  "page",  "data",
};

typedef struct gen_piece {
    char text[8];
    uint8_t len;
    uint32_t id;
} gen_piece;
static gen_piece gen_first[64], gen_next[64], gen_dot;
static int gen_ready;

static void set_piece(gen_piece *g, const char *s)
{
    g->len = (uint8_t)strlen(s);
    memcpy(g->text, s, g->len);
    g->text[g->len] = '\0';
    g->id = kvr_sim_piece_id(g->text, g->len);
}

static void init_gen(void)
{
    for (int w = 0; w < 64; w++) {
        char buf[8];
        size_t n = strlen(words[w]);
        memcpy(buf, words[w], n + 1);
        buf[0] = (char)(buf[0] - 'a' + 'A');
        set_piece(&gen_first[w], buf);
        buf[0] = ' ';
        memcpy(buf + 1, words[w], n + 1);
        set_piece(&gen_next[w], buf);
    }
    set_piece(&gen_dot, ".");
    gen_ready = 1;
}

uint32_t kvr_sim_gen_token(uint64_t gen_seed, size_t i, const char **text, size_t *len)
{
    if (!gen_ready)
        init_gen();
    uint64_t z = gen_seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const gen_piece *g;
    if (i == 0)
        g = &gen_first[z & 63];
    else if (i % 12 == 11)
        g = &gen_dot;
    else
        g = &gen_next[z & 63];
    if (text)
        *text = g->text;
    if (len)
        *len = g->len;
    return g->id;
}
