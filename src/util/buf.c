/* Capped growable byte buffer. */
#include "util/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_buf_init(kvr_buf *b, size_t cap)
{
    memset(b, 0, sizeof(*b));
    b->cap = cap;
}

static int reserve(kvr_buf *b, size_t extra)
{
    if (b->cap && (extra > b->cap || b->len > b->cap - extra))
        return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->alloc)
        return 0;
    size_t n = b->alloc ? b->alloc : 256;
    while (n < need)
        n *= 2;
    char *p = realloc(b->data, n);
    if (!p)
        return -1;
    b->data = p;
    b->alloc = n;
    return 0;
}

int kvr_buf_append_grow(kvr_buf *b, const void *p, size_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int kvr_buf_reserve(kvr_buf *b, size_t n)
{
    if (b->cap)
        n = b->cap > b->len ? (n < b->cap - b->len ? n : b->cap - b->len) : 0;
    return reserve(b, n);
}

int kvr_buf_puts(kvr_buf *b, const char *s)
{
    return kvr_buf_append(b, s, strlen(s));
}

int kvr_buf_printf(kvr_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n < sizeof(small))
        return kvr_buf_append(b, small, (size_t)n);
    if (reserve(b, (size_t)n) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void kvr_buf_consume(kvr_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data)
        b->data[b->len] = '\0';
}

void kvr_buf_reset(kvr_buf *b)
{
    kvr_buf_consume(b, b->len);
}

void kvr_buf_free(kvr_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->alloc = 0;
}
