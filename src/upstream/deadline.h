/* The deadlines of an upstream attempt, one rule for both clients (libcurl's and the native
 * one): the first-byte timeout from kvr_upstream_start() to the response head, then the stream
 * idle timeout between body bytes, not counting time paused by the caller's backpressure. */
#ifndef KVR_UPSTREAM_DEADLINE_H
#define KVR_UPSTREAM_DEADLINE_H
#include <stdint.h>

#include "upstream/upstream.h"

/** When an attempt's timer should first fire (ms; 0 = no deadline at all). */
uint64_t kvr_up_deadline_first(const kvr_upstream_opts *o);

/** Checks an attempt's deadlines at `now_ms` (loop time). `start_ms`: when it started;
 *  `last_rx_ms`: when its last body byte (or its head) came; `got_headers`, `paused`: its
 *  state. Returns KVR_UP_FIRST_BYTE_TIMEOUT or KVR_UP_IDLE_TIMEOUT with the failure text in
 *  `*msg` (static) when one passed; else KVR_UP_OK and `*next_ms`, the delay until the timer
 *  should look again (0: no timer now; a resume re-arms it). */
kvr_upstream_err kvr_up_deadline_check(const kvr_upstream_opts *o, uint64_t now_ms,
                                       uint64_t start_ms, uint64_t last_rx_ms, int got_headers,
                                       int paused, uint64_t *next_ms, const char **msg);

#endif
