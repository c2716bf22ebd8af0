/* One access-log line (docs/operations.md "Access log"): a finished API request as a JSON
 * object on one line, built from the same facts as its server span (proxy/spans.h). */
#ifndef KVR_PROXY_ACCESS_LINE_H
#define KVR_PROXY_ACCESS_LINE_H
#include "proxy/spans.h"
#include "util/buf.h"

/** Appends the line of the request `f` describes (server-span facts: status the client's,
 *  attempt the attempts made, start/end its life), ended at Unix time `wall_ms`, to `out`,
 *  newline included. Members in this order: time (RFC 3339 UTC with ms), request_id, route,
 *  worker, decision, match, attempts, status, prompt_tokens, cached_tokens,
 *  completion_tokens, ttft_ms (to the first body byte for a stream, else to the response
 *  headers), total_ms, client (the address without its port), key (the key's name); null for
 *  what is unknown. Returns 0, or -1 when memory ran out (nothing appended). */
int kvr_access_line(kvr_buf *out, const kvr_span_facts *f, uint64_t wall_ms);

#endif
