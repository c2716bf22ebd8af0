/* kvroute-sim's deterministic pseudo-tokenizer. No model is available to the project, so text
 * is cut into word pieces by fixed rules and each piece gets an id from a hash of its bytes.
 * What matters for routing is copied from real BPE tokenizers (GPT-2/Llama 3 pre-tokenization):
 * a leading space belongs to the following word, digits go in groups of at most 3, pieces
 * average about 4 bytes of English, ids live in a 128,256-entry vocabulary (Llama 3's size)
 * whose top 256 ids are special tokens. Tokenizing the same bytes always gives the same ids,
 * and the text this simulator generates tokenizes back to exactly the ids it generated, so a
 * client that re-sends an answer hits the blocks cached while generating it (as in vLLM with a
 * real tokenizer, most of the time). */
#ifndef KVR_SIM_TOKENIZER_H
#define KVR_SIM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

/** Vocabulary size (Llama 3's); ordinary pieces use ids below KVR_SIM_TOK_FIRST_SPECIAL. */
#define KVR_SIM_VOCAB 128256u
#define KVR_SIM_TOK_FIRST_SPECIAL 128000u
/* Special token ids, numbered as in Llama 3.1's tokenizer. */
#define KVR_SIM_TOK_BOS 128000u          /**< <|begin_of_text|> */
#define KVR_SIM_TOK_EOS 128001u          /**< <|end_of_text|> */
#define KVR_SIM_TOK_START_HEADER 128006u /**< <|start_header_id|> */
#define KVR_SIM_TOK_END_HEADER 128007u   /**< <|end_header_id|> */
#define KVR_SIM_TOK_EOM 128008u          /**< <|eom_id|> (after a tool call) */
#define KVR_SIM_TOK_EOT 128009u          /**< <|eot_id|> (end of a message) */
#define KVR_SIM_TOK_PYTHON_TAG 128010u   /**< <|python_tag|> (starts a tool call) */
#define KVR_SIM_TOK_MEDIA 128011u        /**< placeholder before a non-text content part */

typedef struct kvr_sim_pieces kvr_sim_pieces;

/** A growable token-id vector with a cap. Pushing past `max` stores nothing but still counts
 *  in `total`, so a too-long prompt is measured exactly (for vLLM's context-length error)
 *  without using memory beyond the cap. All-zero plus kvr_sim_toks_init() is valid. */
typedef struct kvr_sim_toks {
    uint32_t *ids; /**< owned; free with kvr_sim_toks_free() */
    size_t len;    /**< ids stored */
    size_t cap;    /**< ids allocated */
    size_t max;    /**< ids that may be stored (0 = unlimited) */
    size_t total;  /**< ids pushed, stored or not; total > len means the cap was hit */
    int oom;       /**< set when an allocation failed; ids are then incomplete */
    kvr_sim_pieces *seen; /**< when set, tokenizing into this vector records every piece there
                               (so /detokenize can print it); kept by _free and _take */
} kvr_sim_toks;

/** Initialises an empty vector that stores at most `max` ids (0 = unlimited). */
void kvr_sim_toks_init(kvr_sim_toks *t, size_t max);
/** Appends one id (see the struct for what happens past `max` or on OOM). */
void kvr_sim_toks_push(kvr_sim_toks *t, uint32_t id);
/** Appends `n` ids at once (same cap rules as kvr_sim_toks_push). */
void kvr_sim_toks_append(kvr_sim_toks *t, const uint32_t *ids, size_t n);
/** Frees the ids; the vector is empty afterwards. */
void kvr_sim_toks_free(kvr_sim_toks *t);
/** Moves the ids out: returns the array (caller frees with free()) and empties `t`. */
uint32_t *kvr_sim_toks_take(kvr_sim_toks *t);

/** Tokenizes `len` bytes of text (any bytes, UTF-8 or not; no special tokens are recognised in
 *  text, as vLLM does for message content) and appends the ids to `out`. Cost: one pass,
 *  a few ns per byte, no allocation beyond `out`'s growth. */
void kvr_sim_tokenize(kvr_sim_toks *out, const char *text, size_t len);

/** The id of one piece of 1..8 bytes (what kvr_sim_tokenize() assigns to that piece). */
uint32_t kvr_sim_piece_id(const char *piece, size_t len);

/** Output token `i` (0-based) of a generation seeded with `gen_seed`: returns its id and sets
 *  `*text`/`*len` to its text (static storage). The text of tokens 0..n-1 concatenated
 *  tokenizes back to exactly their ids: token 0 is a capitalised word without a leading space,
 *  then " word" pieces with a "." every 12th token. */
uint32_t kvr_sim_gen_token(uint64_t gen_seed, size_t i, const char **text, size_t *len);

/* ---- detokenizing ----
 * A piece id is a hash of the piece's bytes, which cannot be inverted, so the pieces seen while
 * tokenizing are remembered in a bounded map (4-way set-associative by id, least recently
 * recorded dropped first). Generated tokens and special tokens need no map. */

/** A map of at most `entries` (rounded down to a multiple of 4, at least 4) id → piece. NULL
 *  when `entries` is 0 or on OOM (no recording, generated and special tokens still print). */
kvr_sim_pieces *kvr_sim_pieces_new(size_t entries);
/** Frees the map (NULL is fine). */
void kvr_sim_pieces_free(kvr_sim_pieces *m);
/** Entries the map holds (never more than its capacity). */
size_t kvr_sim_pieces_count(const kvr_sim_pieces *m);

/** Appends the text of `n` ids to `out`, as a tokenizer's decode() without skipping special
 *  tokens: a generated token prints its text, an id recorded in `m` (may be NULL) its piece,
 *  a special id its Llama 3.1 name (<|begin_of_text|>, <|reserved_special_token_3|>, …), any
 *  other id "<|id|>". Byte sequences that are not UTF-8 (a piece may end inside a character
 *  whose rest is unknown) become U+FFFD, as Python's decode(errors="replace"). Ids must be
 *  below KVR_SIM_VOCAB. Returns 0, or -1 when `out` is full or memory ran out. */
int kvr_sim_detokenize(const kvr_sim_pieces *m, const uint32_t *ids, size_t n, kvr_buf *out);

#endif
