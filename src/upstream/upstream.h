/* Upstream HTTP/1.1 client: one "attempt" = one request to one worker, streamed with
 * backpressure (the body callback may refuse bytes; they come again after a resume). Two
 * implementations sit behind this interface (src/upstream/impl.h), chosen per request by
 * kvr_upstream_opts.client and the URL, and no caller knows which one served an attempt:
 *  - native (native.c, npool.c, respparse.c): libuv TCP, http_parser in response mode, a
 *    keep-alive pool per worker; http:// only. The default.
 *  - libcurl multi_socket driven by the same libuv loop (upstream.c, attempt.c, sock.c; the
 *    pattern of curl's docs/examples/multi-uv.c): https:// (TLS) always, and every URL with
 *    --upstream-client curl. Pitfalls handled there (reference B.5): empty Expect header, no
 *    curl_multi_remove_handle from inside callbacks (deferred kill list), one uv_poll per fd,
 *    no CURLOPT_TIMEOUT on streams (first-byte and idle timers instead), HTTP/1.1 only.
 * Both give the same callbacks, failure kinds and deadlines (docs/operations.md "Upstream
 * failures"). */
#ifndef KVR_UPSTREAM_UPSTREAM_H
#define KVR_UPSTREAM_UPSTREAM_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "http/server.h" /* kvr_http_header */

typedef struct kvr_upstream kvr_upstream;
typedef struct kvr_upstream_attempt kvr_upstream_attempt;

/** Which client serves http:// workers (--upstream-client). */
typedef enum kvr_upstream_client {
    KVR_UP_CLIENT_NATIVE = 0, /**< the native HTTP/1.1 client (default) */
    KVR_UP_CLIENT_CURL = 1,   /**< libcurl, as before the native client existed */
} kvr_upstream_client;

/** Options of the upstream client; times in milliseconds, 0 = no limit. */
typedef struct kvr_upstream_opts {
    uint64_t connect_timeout_ms;     /**< TCP connect (default 5000) */
    uint64_t first_byte_timeout_ms;  /**< kvr_upstream_start() → final response headers, so
                                          it also bounds waiting for a pooled connection and
                                          connecting (default 600000) */
    uint64_t stream_idle_timeout_ms; /**< max gap between body bytes, counted from the
                                          headers; time paused by on_body returning 1 is not
                                          counted (default 120000) */
    long max_host_connections;       /**< open connections per worker; more attempts wait for
                                          a free one (CURLMOPT_MAX_HOST_CONNECTIONS; 0 = none) */
    long max_total_connections;      /**< libcurl's connection cache size (CURLMOPT_MAXCONNECTS;
                                          1024) */
    kvr_upstream_client client;      /**< who serves http:// (native) */
    size_t max_idle;                 /**< native: idle keep-alive connections kept per worker
                                          (64); more are closed */
    uint64_t idle_timeout_ms;        /**< native: an idle pooled connection is closed after
                                          this long (60000; 0 = never) */
    uint64_t max_requests_per_connection; /**< native: a connection is closed after this many
                                          responses (0 = unlimited) */
    uint64_t resend_window_ms;       /**< native: a pooled connection closed before any
                                          response byte re-sends its request on a fresh one
                                          only when that close came within this long of the
                                          request's write (100): a close at once is the
                                          keep-alive race (the worker shut the idle
                                          connection as it was reused); a later one may mean
                                          the worker was working on it, so it is a failure
                                          (the retry rules decide), not a silent duplicate */
    const char *ca_file;             /**< CA bundle that verifies https:// servers
                                          (CURLOPT_CAINFO; borrowed, must outlive the
                                          client); NULL = the system's. The Kubernetes API
                                          client sets its cluster's CA here */
    /** Optional connect-time check (the egress policy): called for every new connection with
     *  the request's URL and the address about to be dialled (after DNS resolution); returning
     *  0 refuses it and the attempt fails with KVR_UP_EGRESS_DENIED. */
    int (*allow_connect)(void *ud, const char *url, const struct sockaddr *sa);
    void *allow_connect_ud;
} kvr_upstream_opts;
void kvr_upstream_opts_default(kvr_upstream_opts *o);

/** Why an attempt failed. The names (kvr_upstream_err_name) are the `kind` label of
 *  kvroute_upstream_errors_total. */
typedef enum kvr_upstream_err {
    KVR_UP_OK = 0,
    KVR_UP_CONNECT,          /**< "connect": refused / unreachable */
    KVR_UP_CONNECT_TIMEOUT,  /**< "connect_timeout" */
    KVR_UP_FIRST_BYTE_TIMEOUT, /**< "first_byte_timeout" */
    KVR_UP_IDLE_TIMEOUT,     /**< "stream_idle_timeout" */
    KVR_UP_RESET,            /**< "reset": connection closed/reset before the response ended */
    KVR_UP_PROTOCOL,         /**< "protocol": malformed response */
    KVR_UP_EGRESS_DENIED,    /**< "egress_denied": the egress policy refused the address */
    KVR_UP_OTHER,            /**< "other" */
} kvr_upstream_err;
const char *kvr_upstream_err_name(kvr_upstream_err e);

/** Callbacks of one attempt; `ud` is the pointer given to kvr_upstream_start(). */
typedef struct kvr_upstream_cbs {
    /** The final (non-1xx) status and headers arrived. Headers exclude the status line; names
     *  and values point into memory valid only during the call. Called at most once. */
    void (*on_headers)(void *ud, int status, const kvr_http_header *h, size_t n);
    /** Body bytes (after on_headers). Return 0 when all `len` bytes were taken, or 1 to take
     *  none and pause: the same bytes come again after kvr_upstream_resume(). */
    int (*on_body)(void *ud, const char *data, size_t len);
    /** The attempt ended: err == KVR_UP_OK after the whole body, else the failure and a short
     *  text. Called exactly once unless the attempt was cancelled; after it the attempt is
     *  freed by the upstream module. `got_headers` tells whether on_headers ran. */
    void (*on_done)(void *ud, kvr_upstream_err err, const char *msg, int got_headers);
} kvr_upstream_cbs;

/** Creates the client on `loop` (options copied). Never returns NULL (aborts on OOM). */
kvr_upstream *kvr_upstream_new(uv_loop_t *loop, const kvr_upstream_opts *opts);
/** Cancels every attempt (no on_done), closes libuv handles; frees once they are closed.
 *  Not from inside an upstream callback. */
void kvr_upstream_close(kvr_upstream *u);

/** Starts a request. `url` is absolute ("http://127.0.0.1:9001/v1/chat/completions");
 *  `h` are extra request headers sent as given (the caller drops hop-by-hop ones; Host and
 *  Content-Length are computed here: Host, Content-Length, Expect, Transfer-Encoding and
 *  Connection in `h` are ignored; no Content-Type or Accept is invented when `h` has none).
 *  `body` (may be NULL when len 0) is NOT copied and must stay valid until on_done or cancel.
 *  `method` is "GET" or "POST" (others as given). on_body and on_done are required,
 *  on_headers may be NULL. May be called from inside callbacks (the transfer then begins on the
 *  next loop iteration; the native client always begins there, so no callback ever runs
 *  before this returns). The request goes out as one write of the head (Content-Length when
 *  there is a body or the method is POST, PUT or PATCH) and the body; Host is the URL's
 *  authority. Returns the attempt, or NULL when it could not be started (then no callback
 *  runs): a URL that is not http:// or https:// (or, native, one with blanks or control
 *  bytes or an unparsable authority), control characters in a header, a header name with ':'
 *  or blanks, or out of memory. */
kvr_upstream_attempt *kvr_upstream_start(kvr_upstream *u, const char *method, const char *url,
                                         const kvr_http_header *h, size_t n, const char *body,
                                         size_t len, const kvr_upstream_cbs *cbs, void *ud);
/** Resumes an attempt paused by on_body returning 1. May call on_body before returning only
 *  if called outside any upstream callback (of either client); otherwise deferred to the next
 *  loop iteration. */
void kvr_upstream_resume(kvr_upstream_attempt *a);
/** Cancels: closes the worker connection (the worker sees the disconnect, so the generation
 *  stops) and frees the attempt; no callback runs after this returns. Safe to call from
 *  inside this attempt's callbacks. */
void kvr_upstream_cancel(kvr_upstream_attempt *a);
/** 1 when the whole request body of `len` bytes has been sent, so the caller may free it
 *  before the attempt ends (a worker may answer before reading all of it: then 0). */
int kvr_upstream_body_sent(kvr_upstream_attempt *a, size_t len);
/** Number of attempts in progress. */
size_t kvr_upstream_active(const kvr_upstream *u);
/** The loop the client runs on (the one given to kvr_upstream_new()), for callers that need
 *  their own timers next to its attempts (e.g. a deadline shorter than first_byte_timeout_ms). */
uv_loop_t *kvr_upstream_loop(const kvr_upstream *u);

#endif
