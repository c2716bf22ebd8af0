/* Attempt deadlines shared by the upstream clients. */
#include "upstream/deadline.h"

static uint64_t min_nz(uint64_t a, uint64_t b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

uint64_t kvr_up_deadline_first(const kvr_upstream_opts *o)
{
    return min_nz(o->first_byte_timeout_ms, o->stream_idle_timeout_ms);
}

kvr_upstream_err kvr_up_deadline_check(const kvr_upstream_opts *o, uint64_t now_ms,
                                       uint64_t start_ms, uint64_t last_rx_ms, int got_headers,
                                       int paused, uint64_t *next_ms, const char **msg)
{
    uint64_t idle = o->stream_idle_timeout_ms;
    *next_ms = 0;
    if (!got_headers) {
        uint64_t fb = o->first_byte_timeout_ms, left = 0;
        if (fb) {
            uint64_t waited = now_ms - start_ms;
            if (waited >= fb) {
                *msg = "no response head within first_byte_timeout_ms";
                return KVR_UP_FIRST_BYTE_TIMEOUT;
            }
            left = fb - waited;
        }
        *next_ms = min_nz(left, idle);
        return KVR_UP_OK;
    }
    /* Time paused by our own backpressure is not idleness: a resume re-arms the timer. */
    if (paused || !idle)
        return KVR_UP_OK;
    uint64_t gap = now_ms - last_rx_ms;
    if (gap >= idle) {
        *msg = "no body bytes within stream_idle_timeout_ms";
        return KVR_UP_IDLE_TIMEOUT;
    }
    *next_ms = idle - gap;
    return KVR_UP_OK;
}
