/* A growable list of error lines, for validators that report every problem at once (the
 * config file: one `FILE:LINE:COL: message` line per error). */
#ifndef KVR_UTIL_ERRLIST_H
#define KVR_UTIL_ERRLIST_H
#include <stddef.h>

/** Zero-initialise (`kvr_errlist e = {0};`); free with kvr_errlist_free(). */
typedef struct kvr_errlist {
    char **msg;   /**< `n` owned NUL-terminated lines, no trailing newline */
    size_t n, cap;
} kvr_errlist;

/** Appends one printf-formatted line (cut at 1 KiB). Out of memory drops the line silently
 *  but still counts it, so `n` never under-reports (its text is then "out of memory"). */
void kvr_errlist_add(kvr_errlist *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Writes every line followed by '\n' to `file` (a FILE *), each prefixed by `prefix`
 *  (may be NULL or ""). */
void kvr_errlist_print(const kvr_errlist *e, void *file, const char *prefix);
/** Frees every line; the list is empty again. */
void kvr_errlist_free(kvr_errlist *e);

#endif
