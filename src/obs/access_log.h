/* The access log's sink (--access-log FILE|-): whole lines appended to a memory buffer and
 * written once per loop turn (a uv_prepare handle, just before the loop waits for I/O), so a
 * burst of requests costs one write(2) and a request never waits for the disk. The buffer is
 * bounded (--access-log-buffer-bytes): a line that does not fit is dropped and counted.
 * SIGUSR1 reopens the file (log rotation). Loop thread only. docs/operations.md "Access
 * log". */
#ifndef KVR_OBS_ACCESS_LOG_H
#define KVR_OBS_ACCESS_LOG_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/** The sink (opaque). */
typedef struct kvr_access_log kvr_access_log;

/** Opens `path` for appending (created 0644 when missing), or standard output for "-".
 *  `max_buffer` bounds the bytes held before writing (>= 1). Returns the sink, or NULL with a
 *  message in `err` (`cap` bytes). */
kvr_access_log *kvr_access_log_open(uv_loop_t *loop, const char *path, size_t max_buffer,
                                    char *err, size_t cap);

/** Appends one line (`len` bytes, its newline included) to the buffer; it is written at the
 *  end of the loop turn. Returns 0, or -1 when the buffer is full (the line is dropped and
 *  counted). `l` may be NULL (access log off: nothing happens, returns 0). */
int kvr_access_log_write(kvr_access_log *l, const char *line, size_t len);

/** Writes what is buffered now. A write error drops the buffered lines (counted) and is
 *  logged once per error kind; a full pipe (EAGAIN) keeps them for the next turn. */
void kvr_access_log_flush(kvr_access_log *l);

/** Flushes, then closes and reopens the file under its name (after logrotate renamed it).
 *  Standard output is kept. Returns 0, or -1 with a message in `err` (the old file then stays
 *  open and in use). */
int kvr_access_log_reopen(kvr_access_log *l, char *err, size_t cap);

/** Lines dropped so far (buffer full or write error). */
uint64_t kvr_access_log_dropped(const kvr_access_log *l);

/** Flushes, closes the file and the loop handle, and frees `l` once the handle is closed
 *  (NULL is fine). */
void kvr_access_log_close(kvr_access_log *l);

#endif
