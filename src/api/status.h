/* The admin status page (docs/metrics.md "Status page"): GET /status, the fleet's live figures
 * as JSON, and the page's own files (HTML, CSS, JavaScript embedded in the binary). */
#ifndef KVR_API_STATUS_H
#define KVR_API_STATUS_H
#include "app/app.h"

/** GET /status: 200 with {time, generation, routes[] {name, policy, workers[] {name, url,
 *  eligible, healthy, breaker, draining, inflight, queue, kv_usage, index_blocks,
 *  sessions}}, hit_rate, prompt_tokens, cached_tokens, hit_rate_trend, decisions,
 *  requests_per_s, error_rate, ttft_ms {p50, p99, samples}}; `queue` and `kv_usage` null
 *  until scraped. Releases `r`. */
void kvr_admin_status(kvr_app *app, kvr_http_req *r);

/** Serves the embedded file at `r`'s path when there is one and the method is GET or HEAD
 *  (no token needed: the page holds no data, it asks for the token itself). Returns 1 when
 *  it answered (and released `r`), 0 otherwise. */
int kvr_admin_web(kvr_http_req *r);

#endif
