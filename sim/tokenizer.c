/* Deterministic pseudo-tokenizer: pre-tokenization after GPT-2/Llama 3's regex, fixed-size
 * pieces, hashed ids. */
#include "tokenizer.h"

#include <stdio.h>
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
    kvr_sim_pieces *seen = t->seen;
    kvr_sim_toks_init(t, max);
    t->seen = seen;
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

/* ---- the map of pieces seen (declared in tokenizer.h's detokenizing section) ---- */

#define WAYS 4

typedef struct piece_ent {
    uint64_t value; /* the piece's bytes, as load() reads them */
    uint32_t id;
    uint32_t len;   /* 0 = empty way */
} piece_ent;

struct kvr_sim_pieces {
    piece_ent *e; /* nsets × WAYS; each set most recently recorded first */
    size_t nsets, count;
};

kvr_sim_pieces *kvr_sim_pieces_new(size_t entries)
{
    if (entries == 0)
        return NULL;
    kvr_sim_pieces *m = calloc(1, sizeof(*m));
    if (m) {
        m->nsets = entries < WAYS ? 1 : entries / WAYS;
        m->e = calloc(m->nsets * WAYS, sizeof(piece_ent));
    }
    if (!m || !m->e) {
        free(m);
        return NULL;
    }
    return m;
}

void kvr_sim_pieces_free(kvr_sim_pieces *m)
{
    if (m)
        free(m->e);
    free(m);
}

size_t kvr_sim_pieces_count(const kvr_sim_pieces *m)
{
    return m ? m->count : 0;
}

static inline piece_ent *set_of(const kvr_sim_pieces *m, uint32_t id)
{
    /* ids of pieces are uniform below FIRST_SPECIAL, so scaling spreads them over the sets
     * without a modulo (the division by a constant is a multiply) */
    return m->e + ((uint64_t)id * m->nsets / KVR_SIM_TOK_FIRST_SPECIAL) * WAYS;
}

/* Runs once per piece on every prompt, so the common case (the piece was the last one recorded
 * with this id) is one compare. A different piece with the same id replaces the older one: the
 * hash cannot tell them apart, the latest is the likelier to be asked for. */
static inline void record(kvr_sim_pieces *m, uint32_t id, uint64_t v, size_t len)
{
    piece_ent *w = set_of(m, id);
    if (w[0].id == id && w[0].len == len && w[0].value == v)
        return;
    size_t k = 0;
    while (k < WAYS && !(w[k].len && w[k].id == id))
        k++;
    if (k == WAYS) {
        k = WAYS - 1;
        m->count += w[k].len == 0;
    }
    memmove(w + 1, w, k * sizeof(*w));
    w[0] = (piece_ent){v, id, (uint32_t)len};
}

static size_t pieces_get(const kvr_sim_pieces *m, uint32_t id, char *buf)
{
    const piece_ent *w = set_of(m, id);
    for (size_t k = 0; k < WAYS; k++) {
        if (!w[k].len || w[k].id != id)
            continue;
        for (uint32_t i = 0; i < w[k].len; i++)
            buf[i] = (char)(w[k].value >> (8 * i));
        return w[k].len;
    }
    return 0;
}

/* Ids are produced into a small local batch and appended in bulk. */
typedef struct batch {
    uint32_t ids[256];
    size_t n;
    kvr_sim_toks *out;
    kvr_sim_pieces *seen;
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
        uint64_t v = load(p, m, avail);
        uint32_t id = id_of(v, m);
        b->ids[b->n++] = id;
        if (b->seen)
            record(b->seen, id, v, m);
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
    bt.seen = out->seen;
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
static const gen_piece *gen_by_id[256]; /* open addressing on the id's low byte */
static int gen_ready;

static void set_piece(gen_piece *g, const char *s)
{
    g->len = (uint8_t)strlen(s);
    memcpy(g->text, s, g->len);
    g->text[g->len] = '\0';
    g->id = kvr_sim_piece_id(g->text, g->len);
}

static void index_piece(const gen_piece *g)
{
    size_t i = g->id & 255;
    while (gen_by_id[i])
        i = (i + 1) & 255;
    gen_by_id[i] = g;
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
    for (int w = 0; w < 64; w++) {
        index_piece(&gen_first[w]);
        index_piece(&gen_next[w]);
    }
    index_piece(&gen_dot);
    gen_ready = 1;
}

static const gen_piece *gen_lookup(uint32_t id)
{
    if (!gen_ready)
        init_gen();
    for (size_t i = id & 255; gen_by_id[i]; i = (i + 1) & 255)
        if (gen_by_id[i]->id == id)
            return gen_by_id[i];
    return NULL;
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

/* ---- detokenizing ---- */

/* Llama 3.1's names for 128000..128010; the rest are <|reserved_special_token_N|>. */
static const char *const special_names[] = {
    "<|begin_of_text|>",  "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
};

#define TEXT_MAX 48

static size_t id_text(const kvr_sim_pieces *m, uint32_t id, char buf[TEXT_MAX])
{
    uint32_t sp = id - KVR_SIM_TOK_FIRST_SPECIAL;
    if (id >= KVR_SIM_TOK_FIRST_SPECIAL && sp < sizeof(special_names) / sizeof(*special_names))
        return (size_t)snprintf(buf, TEXT_MAX, "%s", special_names[sp]);
    if (id >= KVR_SIM_TOK_FIRST_SPECIAL)
        return (size_t)snprintf(buf, TEXT_MAX, "<|reserved_special_token_%u|>", sp - 8);
    const gen_piece *g = gen_lookup(id);
    if (g) {
        memcpy(buf, g->text, g->len);
        return g->len;
    }
    size_t n = m ? pieces_get(m, id, buf) : 0;
    return n ? n : (size_t)snprintf(buf, TEXT_MAX, "<|%u|>", id);
}

/* Bytes of the UTF-8 sequence at s[0..n): the whole sequence when valid (*ok = 1), else the
 * maximal invalid subpart (>= 1 byte), which Python's decoder replaces by one U+FFFD. */
static size_t utf8_seq(const unsigned char *s, size_t n, int *ok)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    size_t need = 0;
    *ok = c < 0x80;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef)
        need = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    if (!need || n < 2 || s[1] < lo || s[1] > hi)
        return 1;
    size_t k = 2;
    while (k <= need && k < n && (s[k] & 0xc0) == 0x80)
        k++;
    *ok = k == need + 1;
    return k;
}

static int put_utf8_lossy(kvr_buf *out, const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, run = 0;
    int rc = 0;
    while (i < n) {
        int ok;
        size_t k = utf8_seq(s + i, n - i, &ok);
        if (!ok) {
            rc |= kvr_buf_append(out, text + run, i - run);
            rc |= kvr_buf_append(out, "\xef\xbf\xbd", 3);
            run = i + k;
        }
        i += k;
    }
    rc |= kvr_buf_append(out, text + run, n - run);
    return rc ? -1 : 0;
}

int kvr_sim_detokenize(const kvr_sim_pieces *m, const uint32_t *ids, size_t n, kvr_buf *out)
{
    /* Pieces are cut at byte counts, so a character may span two of them: concatenate first,
     * repair the UTF-8 once. */
    kvr_buf raw;
    kvr_buf_init(&raw, out->cap);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char t[TEXT_MAX];
        rc = kvr_buf_append(&raw, t, id_text(m, ids[i], t));
    }
    if (!rc)
        rc = put_utf8_lossy(out, raw.data ? raw.data : "", raw.len);
    kvr_buf_free(&raw);
    return rc;
}
