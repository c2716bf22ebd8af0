/* Growable byte buffer with a hard cap (the curl "dynbuf" idea): every append either fits under
 * the cap or fails without changing the buffer, so no input can grow memory past a limit. */
#ifndef KVR_UTIL_BUF_H
#define KVR_UTIL_BUF_H
#include <stddef.h>
#include <string.h>

/** A byte buffer. All-zero is a valid empty buffer with no cap (cap 0 = unlimited).
 *  `data` is owned by the buffer and always NUL-terminated after the last byte (not counted
 *  in `len`) once anything was appended; free with kvr_buf_free(). */
typedef struct kvr_buf {
    char *data;   /**< bytes; NULL until the first append */
    size_t len;   /**< bytes used */
    size_t alloc; /**< bytes allocated */
    size_t cap;   /**< maximum len in bytes; 0 = unlimited */
} kvr_buf;

/** Initialises an empty buffer whose length may never exceed `cap` bytes (0 = unlimited). */
void kvr_buf_init(kvr_buf *b, size_t cap);
/** kvr_buf_append() when the bytes may not fit the allocation (grows it, checks the cap). */
int kvr_buf_append_grow(kvr_buf *b, const void *p, size_t n);
/** Appends `n` bytes. Returns 0, or -1 (buffer unchanged) when the cap would be exceeded or
 *  memory ran out. Inline: response heads and upstream requests are built from dozens of
 *  small appends, and most fit the allocation already. */
static inline int kvr_buf_append(kvr_buf *b, const void *p, size_t n)
{
    /* room for n and the NUL, and the cap not passed: the bytes go in as they are */
    if (b->data && b->len < b->alloc && n < b->alloc - b->len &&
        (!b->cap || (b->len <= b->cap && n <= b->cap - b->len))) {
        if (n)
            memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = '\0';
        return 0;
    }
    return kvr_buf_append_grow(b, p, n);
}
/** Makes room for `n` more bytes (at most what the cap leaves) without changing the
 *  contents, so that appends up to that size do not reallocate. Returns 0, or -1 when memory
 *  ran out (buffer unchanged). */
int kvr_buf_reserve(kvr_buf *b, size_t n);
/** Appends a NUL-terminated string; same return as kvr_buf_append(). */
int kvr_buf_puts(kvr_buf *b, const char *s);
/** printf-style append; same return as kvr_buf_append(). */
int kvr_buf_printf(kvr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Drops the first `n` bytes (n > len drops all), keeping the allocation. */
void kvr_buf_consume(kvr_buf *b, size_t n);
/** Sets len to 0, keeping the allocation. */
void kvr_buf_reset(kvr_buf *b);
/** Frees the bytes; the buffer is then empty and reusable with the same cap. */
void kvr_buf_free(kvr_buf *b);

#endif
