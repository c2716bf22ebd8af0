/* Error line list (see errlist.h). */
#include "util/errlist.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char oom[] = "out of memory";

void kvr_errlist_add(kvr_errlist *e, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 8;
        char **m = realloc(e->msg, nc * sizeof(*m));
        if (!m)
            return;
        e->msg = m;
        e->cap = nc;
    }
    char *s = strdup(line);
    e->msg[e->n++] = s ? s : oom;
}

void kvr_errlist_print(const kvr_errlist *e, void *file, const char *prefix)
{
    for (size_t i = 0; i < e->n; i++)
        fprintf(file, "%s%s\n", prefix ? prefix : "", e->msg[i]);
}

void kvr_errlist_free(kvr_errlist *e)
{
    for (size_t i = 0; i < e->n; i++)
        if (e->msg[i] != oom)
            free(e->msg[i]);
    free(e->msg);
    e->msg = NULL;
    e->n = e->cap = 0;
}
