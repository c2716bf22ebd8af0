/* libFuzzer harness for the YAML config file loader (src/config/file.c): any bytes must give
 * 0 or -1 with errors listed, never a crash, a leak or undefined behaviour. The input is
 * handed over as a memfd named by its /proc path, so no temp file is left behind. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("kvr-fuzz-config", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            close(fd);
            return 0;
        }
        off += (size_t)n;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);

    kvr_config c;
    kvr_errlist errs = {0};
    kvr_config_default(&c);
    int rc = kvr_config_file_load(&c, path, &errs);
    /* The contract the caller relies on: -1 exactly when something was reported, and what was
     * kept is well formed (cross-checks run on it even after errors). */
    if ((rc == 0) != (errs.n == 0))
        __builtin_trap();
    for (size_t i = 0; i < c.nworkers; i++)
        if (!c.workers[i].url || !c.workers[i].name || !(c.workers[i].weight > 0))
            __builtin_trap();
    for (size_t r = 0; r < c.nroutes; r++) {
        const kvr_route_spec *rs = &c.routes[r];
        if (!rs->name)
            __builtin_trap();
        for (size_t a = 0; a < rs->naliases; a++)
            if (!rs->aliases[a])
                __builtin_trap();
        for (size_t t = 0; t < rs->ntargets; t++)
            if (!rs->targets[t].worker || rs->targets[t].weight < 0)
                __builtin_trap();
        for (size_t s = 0; s < rs->nsettings; s++)
            if (!rs->settings[s].key || !rs->settings[s].value)
                __builtin_trap();
    }
    kvr_config_free(&c);
    kvr_errlist_free(&errs);

    /* The whole load over the file: checks, then data-parallel workers expanded into ranks
     * (each "URL#r" of its engine URL, targets naming them). */
    char *argv[] = {"kvroute", "--config", path};
    kvr_config_default(&c);
    memset(&errs, 0, sizeof(errs));
    if (kvr_config_load(&c, 3, argv, &errs) == 0) {
        for (size_t i = 0; i < c.nworkers; i++) {
            const kvr_worker_spec *w = &c.workers[i];
            if (w->dp_url && (w->dp_rank < 0 || (uint32_t)w->dp_rank >= w->data_parallel_size ||
                              strncmp(w->url, w->dp_url, strlen(w->dp_url)) != 0 ||
                              w->url[strlen(w->dp_url)] != '#'))
                __builtin_trap();
        }
        if (c.nworkers > KVR_MAX_RANK_WORKERS)
            __builtin_trap();
    }
    kvr_config_free(&c);
    kvr_errlist_free(&errs);
    close(fd);
    return 0;
}
