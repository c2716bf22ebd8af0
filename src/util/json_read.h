/* A strict JSON reader that builds jansson values, for request bodies whose tree is needed
 * (the routing text of the policies that read it, admin, kvroute-sim). The proxy reads every
 * other field of a request with util/json_scan.h, which accepts exactly the same inputs
 * without building a tree.
 *
 * Why: jansson's own lexer costs ~13 ns per byte (it copies every byte through a growable
 * buffer one at a time), i.e. 110-170 µs for an 8 KB prompt, more than the sim's whole
 * per-request budget (docs/performance.md). This reader scans strings 8 bytes at a time and
 * hands each finished string to jansson in one call, ~1 ns per byte. Everything after parsing
 * (json_object_get, …) is plain jansson.
 *
 * It accepts exactly what json_loadb(buf, len, 0, &err) accepts and yields a json_equal()
 * value (tests/unit/test_json_read.c checks this differentially): RFC 8259 grammar, a
 * top-level object or array, valid UTF-8 only (no overlongs, surrogates or code points above
 * U+10FFFF), \u escapes with surrogate pairs, no \u0000 (jansson refuses it without
 * JSON_ALLOW_NUL), integers that fit json_int_t (else an error, as jansson), reals via strtod
 * (overflow is an error), duplicate keys keep the last value, nesting depth at most 2048
 * (jansson's JSON_PARSER_MAX_DEPTH), nothing but whitespace after the value. Error messages
 * differ from jansson's wording. One exception, a jansson bug (found by fuzz/fuzz_keys.c):
 * jansson 2.14 skips a single NUL byte right after a number or a true/false/null literal (the
 * lexer reads one byte past the token and ungets it, and its stream takes a NUL in its buffer
 * for "empty"), so it accepts "[1\0]" as [1]; this reader rejects that, as RFC 8259 does. */
#ifndef KVR_UTIL_JSON_READ_H
#define KVR_UTIL_JSON_READ_H
#include <jansson.h>
#include <stddef.h>

/** Parses `len` bytes at `buf` (no NUL needed). Returns a new reference (caller decrefs), or
 *  NULL with `err` (may be NULL) filled: text, line and column (1-based) and position. */
json_t *kvr_json_read(const char *buf, size_t len, json_error_t *err);

/** In `len` bytes of valid JSON whose top level is an object (a body kvr_json_read accepted),
 *  finds the value of member `key` (an ASCII name, compared with the key as decoded, so
 *  "mod\u0065l" is "model"; the last occurrence wins, as in parsing) and returns its byte offset with its length in
 *  `*vlen`, quotes included for a string; -1 when there is no such member. Used to rewrite
 *  one value of a client's body without re-serialising the rest. */
long kvr_json_member_span(const char *buf, size_t len, const char *key, size_t *vlen);

/** One top-level member of a JSON object, as byte offsets into the document. */
typedef struct kvr_json_member {
    size_t start;     /**< its key's opening quote */
    size_t key;       /**< the key's first byte (after the quote), as written (escapes kept) */
    size_t key_len;
    size_t value;     /**< its value's first byte */
    size_t value_len; /**< quotes included for a string */
    size_t end;       /**< just past the value */
} kvr_json_member;

/** Iterates the top-level members of `len` bytes of valid JSON whose top level is an object
 *  (a body kvr_json_read accepted), in order: `*pos` starts at 0 and is advanced. Returns 1
 *  with `*m` filled, 0 after the last member, -1 when the top level is no object. */
int kvr_json_member_next(const char *buf, size_t len, size_t *pos, kvr_json_member *m);
/** 1 when member `m` of `buf` is named `key` (ASCII; escapes decoded as in
 *  kvr_json_member_span), else 0. */
int kvr_json_member_is(const char *buf, const kvr_json_member *m, const char *key);

#endif
