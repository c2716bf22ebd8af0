/* Test helper shared by the config tests: YAML written to a temp file, loaded by a loader the
 * test chooses (the file reader alone, or the whole command-line load around it), freed
 * afterwards. Header-only: each test binary is one .c file. */
#ifndef KVR_TESTS_CONFIG_LOADED_H
#define KVR_TESTS_CONFIG_LOADED_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"

/** A loaded file: the config over the defaults, its errors and the loader's return. */
typedef struct {
    char path[64];
    kvr_config c;
    kvr_errlist errs;
    int rc;
} loaded;

/** Reads the file at `path` into `c` (already holding the defaults); the loader's return. */
typedef int (*config_loader)(kvr_config *c, const char *path, kvr_errlist *errs);

/** Writes `yaml` to a fresh temp file and loads it with `loader`. Free with done(). */
static inline loaded *load_with(config_loader loader, const char *yaml)
{
    loaded *l = calloc(1, sizeof(*l));
    assert_non_null(l);
    snprintf(l->path, sizeof(l->path), "/tmp/kvr-config-XXXXXX");
    int fd = mkstemp(l->path);
    assert_true(fd >= 0);
    size_t n = strlen(yaml);
    assert_int_equal(write(fd, yaml, n), (ssize_t)n);
    close(fd);
    kvr_config_default(&l->c);
    l->rc = loader(&l->c, l->path, &l->errs);
    return l;
}

/** Removes the temp file and frees everything load_with() made. */
static inline void done(loaded *l)
{
    unlink(l->path);
    kvr_config_free(&l->c);
    kvr_errlist_free(&l->errs);
    free(l);
}

#endif
