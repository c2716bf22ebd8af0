/* The access log's buffered, loop-driven sink. */
#include "obs/access_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/buf.h"
#include "util/log.h"

struct kvr_access_log {
    uv_prepare_t flush; /* runs the write at the end of each loop turn while lines wait */
    char *path;         /* NULL for standard output */
    int fd;
    size_t max;
    kvr_buf buf;
    uint64_t dropped;
    int last_errno;     /* the last write error logged, so a full disk logs once */
};

static int open_file(const char *path)
{
    return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void on_prepare(uv_prepare_t *h)
{
    kvr_access_log_flush(h->data);
}

kvr_access_log *kvr_access_log_open(uv_loop_t *loop, const char *path, size_t max_buffer,
                                    char *err, size_t cap)
{
    kvr_access_log *l = calloc(1, sizeof(*l));
    int stdout_ = strcmp(path, "-") == 0;
    if (!l || (!stdout_ && !(l->path = strdup(path)))) {
        free(l);
        snprintf(err, cap, "--access-log: out of memory");
        return NULL;
    }
    l->fd = stdout_ ? STDOUT_FILENO : open_file(path);
    if (l->fd < 0) {
        snprintf(err, cap, "--access-log %s: %s", path, strerror(errno));
        free(l->path);
        free(l);
        return NULL;
    }
    l->max = max_buffer ? max_buffer : 1;
    kvr_buf_init(&l->buf, 0);
    uv_prepare_init(loop, &l->flush);
    l->flush.data = l;
    return l;
}

int kvr_access_log_write(kvr_access_log *l, const char *line, size_t len)
{
    if (!l)
        return 0;
    if (l->buf.len + len > l->max || kvr_buf_append(&l->buf, line, len) < 0) {
        l->dropped++;
        return -1;
    }
    if (!uv_is_active((uv_handle_t *)&l->flush))
        uv_prepare_start(&l->flush, on_prepare);
    return 0;
}

/* Lines in the first `n` bytes of the buffer. */
static uint64_t lines_in(const kvr_access_log *l, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += l->buf.data[i] == '\n';
    return k;
}

void kvr_access_log_flush(kvr_access_log *l)
{
    if (!l)
        return;
    size_t off = 0;
    while (off < l->buf.len) {
        ssize_t w = write(l->fd, l->buf.data + off, l->buf.len - off);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break; /* a full pipe: the rest goes next turn */
        int e = w < 0 ? errno : EIO;
        if (e != l->last_errno)
            KVR_WARN("msg=\"access log write failed: lines dropped\" path=%s error=\"%s\"",
                     l->path ? l->path : "-", strerror(e));
        l->last_errno = e;
        l->dropped += lines_in(l, l->buf.len) - lines_in(l, off);
        off = l->buf.len;
    }
    if (off == l->buf.len) {
        if (l->buf.len)
            kvr_buf_reset(&l->buf);
        uv_prepare_stop(&l->flush);
    } else if (off) {
        kvr_buf_consume(&l->buf, off);
    }
}

int kvr_access_log_reopen(kvr_access_log *l, char *err, size_t cap)
{
    if (!l)
        return 0;
    kvr_access_log_flush(l);
    if (!l->path)
        return 0;
    int fd = open_file(l->path);
    if (fd < 0) {
        snprintf(err, cap, "--access-log %s: %s", l->path, strerror(errno));
        return -1;
    }
    close(l->fd);
    l->fd = fd;
    l->last_errno = 0;
    return 0;
}

uint64_t kvr_access_log_dropped(const kvr_access_log *l)
{
    return l ? l->dropped : 0;
}

static void on_closed(uv_handle_t *h)
{
    kvr_access_log *l = h->data;
    kvr_buf_free(&l->buf);
    free(l->path);
    free(l);
}

void kvr_access_log_close(kvr_access_log *l)
{
    if (!l)
        return;
    kvr_access_log_flush(l);
    if (l->path)
        close(l->fd);
    uv_prepare_stop(&l->flush);
    uv_close((uv_handle_t *)&l->flush, on_closed);
}
