/* A validating JSON scanner: checks that a buffer is one JSON text and locates chosen
 * top-level members, without building a tree and without allocating (issue 18: the fields
 * every proxied request needs are read this way; a tree is built only when the routing text
 * is).
 *
 * Acceptance is exactly kvr_json_read()'s (util/json_read.h), i.e. json_loadb(buf, len, 0)'s
 * minus jansson's NUL quirk: the RFC 8259 grammar (§2-§7) with a top-level object or array,
 * strings of valid UTF-8 (RFC 8259 §8.1; no overlongs, surrogates or code points above
 * U+10FFFF), escapes of §7 with \u surrogate pairs and no \u0000, integers (no fraction or
 * exponent) that fit a signed 64-bit json_int_t, reals that strtod() does not overflow to
 * infinity (RFC 8259 §6 leaves the range to implementations; this is jansson's), nesting of at
 * most KVR_JSON_MAX_DEPTH values, nothing but whitespace after the text.
 * tests/unit/test_json_scan.c and fuzz/fuzz_keys.c check this against the tree.
 *
 * Strings are skipped 16 bytes at a time (SSE2, else 8 with SWAR): only '"', '\\', control
 * bytes and bytes >= 0x80 stop the bulk skip. Duplicate member names keep the last value (as
 * the tree does). */
#ifndef KVR_UTIL_JSON_SCAN_H
#define KVR_UTIL_JSON_SCAN_H
#include <stddef.h>
#include <stdint.h>

/** Deepest nesting accepted, counting every value (jansson's JSON_PARSER_MAX_DEPTH): a scalar
 *  inside 2047 arrays is accepted, inside 2048 it is not. */
#define KVR_JSON_MAX_DEPTH 2048
/** Longest member name kvr_json_scan() can look for, bytes (decoded). */
#define KVR_JSON_SCAN_NAME_MAX 63

/** The kind of a located value. */
typedef enum kvr_json_kind {
    KVR_JSON_ABSENT = 0, /**< no such member (or the text's top level is not an object) */
    KVR_JSON_OBJECT,
    KVR_JSON_ARRAY,
    KVR_JSON_STRING,
    KVR_JSON_INTEGER, /**< a number without fraction or exponent (fits 64 bits) */
    KVR_JSON_REAL,    /**< a number with a fraction or an exponent */
    KVR_JSON_TRUE,
    KVR_JSON_FALSE,
    KVR_JSON_NULL
} kvr_json_kind;

/** Where a located value lies in the scanned buffer, and what it is. For arrays, a summary of
 *  the elements, gathered during the same pass (what request validation reads). */
typedef struct kvr_json_span {
    size_t off;         /**< first byte of the value, from the start of the buffer */
    size_t len;         /**< bytes of the value as written (a string's quotes included) */
    kvr_json_kind kind; /**< KVR_JSON_ABSENT: off, len and the rest are 0 */
    int escaped;        /**< a string: it contains a backslash escape (else its bytes
                             between the quotes are its decoded value) */
    long long ival;     /**< an integer's value; 0 for any other kind */
    /* Arrays only (0 otherwise): */
    size_t count;       /**< elements */
    size_t nonstring;   /**< elements that are not strings */
    size_t nontoken;    /**< elements that are not token ids (integers >= 0) */
    size_t nontokarr;   /**< elements that are not non-empty arrays of token ids */
    size_t first_norole; /**< index of the first element that is not an object whose member
                              "role" (its last occurrence) is a string; `count` when none */
} kvr_json_span;

/** Scans `len` bytes at `buf` (no NUL needed). `names` lists `n` distinct member names
 *  (decoded bytes, at most KVR_JSON_SCAN_NAME_MAX each; "mod\u0065l" in the text is "model");
 *  `out[i]` receives the value of the last top-level member named `names[i]`, or
 *  KVR_JSON_ABSENT (also when the top level is an array). `n` may be 0 (validation only;
 *  `names` and `out` may then be NULL). Returns KVR_JSON_OBJECT or KVR_JSON_ARRAY (the top
 *  level) when the buffer is one JSON text kvr_json_read() accepts; else -1 (then `out` is
 *  unspecified: call kvr_json_read() for the error's wording and position). Never
 *  allocates; stack use is bounded (~300 bytes of nesting state). */
int kvr_json_scan(const char *buf, size_t len, const char *const *names, size_t n,
                  kvr_json_span *out);

/** Where one element of an array lies (kvr_json_scan_elems()). */
typedef struct kvr_json_elem {
    size_t off;         /**< its first byte, from the start of the buffer */
    size_t len;         /**< its bytes as written */
    kvr_json_kind kind; /**< what it is (an integer or a real: KVR_JSON_INTEGER or _REAL) */
    kvr_json_kind role; /**< an object's last "role" member's kind (KVR_JSON_ABSENT: none) */
    int keyed;          /**< nonzero when a kvr_json_known's find() set `key` for these
                             bytes (the value is find's to give a meaning to) */
    uint64_t key[2];    /**< what that find() computed (its own meaning; e.g. a hash) */
} kvr_json_elem;

/** Elements accepted before, for kvr_json_scan_known(): an element of the recorded array
 *  that is an object of at least `min` bytes is first located without validation and its
 *  bytes offered to `find`; when they are known, the scan takes them as they were taken
 *  before instead of validating them again (a conversation's next turn resends its earlier
 *  messages byte for byte). */
typedef struct kvr_json_known {
    /** [p, p + n): the bytes an element would have if the body is valid. Returns 1 when
     *  exactly these bytes were accepted before as an element of such an array (then
     *  e->role must be the kind its last "role" member had), else 0. May set e->key and
     *  e->keyed (nonzero) for the caller (e.g. the hash it computed), on a hit or a miss. */
    int (*find)(void *ctx, const char *p, size_t n, kvr_json_elem *e);
    /** Optional (NULL: none): where an element starting at p, `avail` bytes left in the
     *  body, would end if it is one accepted before: its length in bytes, or 0 for no
     *  guess. Only a hint: the scan asks find() about exactly that many bytes and, on a
     *  miss, locates the element itself as without it. Lets a resent element be hashed
     *  without first walking its strings to find its end. */
    size_t (*guess)(void *ctx, const char *p, size_t avail);
    void *ctx;
    size_t min; /**< smaller elements are validated without asking (bytes) */
} kvr_json_known;

/** kvr_json_scan(), recording in the same pass where the first `cap` elements of the array
 *  located for `names[which]` lie (`which` < `n`): `elems[i]` for i < min(cap,
 *  out[which].count) when out[which] is an array (its last occurrence, as the span); nothing
 *  else is written. Lets a walk over those elements (the messages of a chat body) start at
 *  each one without skipping the ones before. Same returns as kvr_json_scan(). */
int kvr_json_scan_elems(const char *buf, size_t len, const char *const *names, size_t n,
                        kvr_json_span *out, size_t which, kvr_json_elem *elems, size_t cap);

/** kvr_json_scan_elems() that asks `known` (may be NULL) about the recorded elements (see
 *  kvr_json_known): the same returns, spans and elements as without it, provided `find`
 *  answers 1 only for bytes a scan accepted as such an element. */
int kvr_json_scan_known(const char *buf, size_t len, const char *const *names, size_t n,
                        kvr_json_span *out, size_t which, kvr_json_elem *elems, size_t cap,
                        const kvr_json_known *known);

/** Turns the 32-byte string scan off (0) or back on (1, the default where the CPU has AVX2;
 *  a no-op elsewhere): tests and fuzz harnesses compare the two paths. Not thread-safe; call
 *  before scanning. */
void kvr_json_scan_wide(int on);

/** The last member named `name` of the object `obj` (a span located by kvr_json_scan() in
 *  `buf`) into `*out` (offsets from the start of `buf`; array summaries included). Returns 1
 *  when found, 0 when not (then `*out` is KVR_JSON_ABSENT), also when `obj` is no object. */
int kvr_json_span_member(const char *buf, const kvr_json_span *obj, const char *name,
                         kvr_json_span *out);

/** The first element of the array `arr` (a span located by kvr_json_scan() in `buf`) into
 *  `*out` (kind, offsets from the start of `buf`, an integer's value, a string's `escaped`;
 *  no array summary). Returns 1, or 0 when `arr` is no array or is empty (`*out` then
 *  KVR_JSON_ABSENT). */
int kvr_json_span_first(const char *buf, const kvr_json_span *arr, kvr_json_span *out);

/** A cursor over the elements of an array or the members of an object that kvr_json_scan()
 *  accepted (a span it, kvr_json_span_member(), kvr_json_span_first() or this iterator
 *  located in `buf`), for walking nested values without a tree: each step skips one value
 *  (strings in bulk, containers by depth), so a walk is linear in the bytes walked. The text
 *  is assumed valid (it was scanned); reads stay inside the container's span. Holds no
 *  memory: copy or drop it freely; an all-zero one gives nothing. */
typedef struct kvr_json_iter {
    const char *buf; /**< the scanned buffer (borrowed) */
    size_t pos;      /**< offset of the next byte to read; past the last value, the offset
                          of the closing bracket */
    size_t end;      /**< offset of the container's closing bracket, or a bound of it (an
                          iterator from kvr_json_iter_descend()) */
    int object;      /**< 1: members of an object; 0: elements of an array */
    struct kvr_json_iter *parent; /**< kvr_json_iter_descend()'s iterator to move on when
                                       this one ends, or NULL */
} kvr_json_iter;

/** Starts `*it` at the first element or member of `v` (an array or object span of `buf`).
 *  Returns 1, or 0 when `v` is neither (then kvr_json_iter_next() returns 0 at once). */
int kvr_json_iter_init(kvr_json_iter *it, const char *buf, const kvr_json_span *v);

/** The next element (array) or member (object), in the order written; duplicate member
 *  names come as often as written (the last is the value a tree keeps). `*val` (may be NULL)
 *  gets the value's span: kind, offsets from the start of `buf`, an integer's value, a
 *  string's `escaped`; no array summary. For an object, `*name` (may be NULL) gets the member
 *  name as a KVR_JSON_STRING span (quotes included; decode it with kvr_json_span_string() or
 *  compare it with kvr_json_span_is()). Returns 1, or 0 past the last one. */
int kvr_json_iter_next(kvr_json_iter *it, kvr_json_span *name, kvr_json_span *val);

/** kvr_json_iter_next() for the elements of an array that are walked anyway, without
 *  skipping an object element first (one pass over it instead of two): when the next element
 *  of the array iterator `*it` is an object, `*val` gets its kind and offset (len 0: not
 *  known yet) and `*inner` iterates its members; walking `*inner` to its end (until
 *  kvr_json_iter_next() returns 0, or kvr_json_iter_members()) moves `*it` past the object,
 *  whose length is then `it->pos - val->off`. `*it` must not be used before that. Any other
 *  element comes as from kvr_json_iter_next() (len known) and `*inner` gives nothing; so do
 *  the members of an object iterator. Returns 1, or 0 past the last element. */
int kvr_json_iter_descend(kvr_json_iter *it, kvr_json_span *val, kvr_json_iter *inner);

/** kvr_json_span_members() over the members an object iterator has left (all of them after
 *  kvr_json_iter_init() or kvr_json_iter_descend()), walking it to its end. */
size_t kvr_json_iter_members(kvr_json_iter *it, const char *const *names, size_t n,
                             kvr_json_span *out);

/** 1 when the `len` bytes at `p` are valid UTF-8 by the rules the scanner applies to strings
 *  (jansson's: no overlongs, no surrogates, nothing above U+10FFFF; NUL bytes allowed), so
 *  that jansson's json_stringn() would take them. Else 0. */
int kvr_json_utf8_valid(const char *p, size_t len);

/** 1 when the string span `s` of `buf` decodes to exactly the NUL-terminated `str` (at most
 *  KVR_JSON_SCAN_NAME_MAX bytes when `s` has escapes; "mod\u0065l" is "model"), else 0 (also
 *  when `s` is no string). Never allocates. */
int kvr_json_span_is(const char *buf, const kvr_json_span *s, const char *str);

/** The members named `names[0..n-1]` (distinct, each at most KVR_JSON_SCAN_NAME_MAX bytes) of
 *  the object `obj` (a span of `buf`) in one pass over its members: `out[i]` gets the value
 *  of the last member named `names[i]` (as kvr_json_iter_next() gives it) or KVR_JSON_ABSENT.
 *  Returns how many names were found (0 also when `obj` is no object). */
size_t kvr_json_span_members(const char *buf, const kvr_json_span *obj,
                             const char *const *names, size_t n, kvr_json_span *out);

/** Decodes the string `s` (a KVR_JSON_STRING span of `buf`) into `out`, writing at most `cap`
 *  bytes (no NUL added). Returns the decoded length in bytes, which may exceed `cap` (then
 *  call again with a larger buffer); 0 when `s` is not a string. Decoded strings never hold a
 *  NUL byte (\u0000 is refused by the scan). */
size_t kvr_json_span_string(const char *buf, const kvr_json_span *s, char *out, size_t cap);

#endif
