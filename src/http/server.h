/* Inbound HTTP/1.1 server on a libuv loop, parsing with Node's http_parser (Debian's
 * libhttp-parser). It owns client connections: limits, absolute header/body deadlines, keep-alive
 * idle timeout, pipelining (one request at a time), response framing (Content-Length, chunked,
 * or close-delimited for HTTP/1.0), write coalescing and client-disconnect detection.
 * The request-validation rules follow ../shared reference table B.1 (RFC 9112 framing).
 *
 * Protocol choices worth knowing (implementation in src/http/, tests in
 * tests/unit/test_http_server.c):
 *  - Bare LF line endings in the request head are accepted (http_parser does; RFC 9112 2.2
 *    allows it). A bare CR, obs-fold, a non-token header-name byte (e.g. "Content-Length : 2")
 *    and anything after chunk data other than CRLF are 400.
 *  - Only origin-form targets ("/path?query"); absolute-, authority- and asterisk-form are 400.
 *  - Methods: GET HEAD POST PUT DELETE OPTIONS PATCH; other known methods 501, garbage 400.
 *  - Transfer-Encoding must be exactly "chunked" (another final coding 400, extra codings 501,
 *    on HTTP/1.0 400); Content-Length with Transfer-Encoding, duplicate or malformed
 *    Content-Length are 400; a declared length over max_body_bytes is 413 before any body byte.
 *  - Every error the server answers itself is a JSON body from kvr_oai_error_json() with
 *    Connection: close; the write side is then shut down and input drained briefly (lingering
 *    close) so the client can read the error.
 *  - A client that half-closes (EOF) while its request is with the handler counts as gone. */
#ifndef KVR_HTTP_SERVER_H
#define KVR_HTTP_SERVER_H
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct kvr_http_server kvr_http_server;
typedef struct kvr_http_req kvr_http_req;

/** One header as name/value byte ranges (not NUL-terminated unless stated). */
typedef struct kvr_http_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} kvr_http_header;

/** Limits and deadlines of the server; every field is a kvroute flag. */
typedef struct kvr_http_limits {
    size_t max_header_bytes;      /**< request line + headers, bytes (431 above; default 65536) */
    size_t max_headers;           /**< header lines (431 above; default 256) */
    size_t max_body_bytes;        /**< request body, bytes (413 above; default 32 MiB) */
    uint64_t header_timeout_ms;   /**< absolute deadline from the first byte of a request to the
                                       end of its headers (408 + close; default 10000) */
    uint64_t body_timeout_ms;     /**< absolute deadline from end of headers to end of body
                                       (408 + close; default 60000) */
    uint64_t idle_timeout_ms;     /**< keep-alive idle time between requests (close; 60000) */
    size_t max_total_body_bytes;  /**< request body bytes held at once by all connections
                                       (bodies stay held while their request is handled); a
                                       request that would pass it gets 503 + close (1 GiB) */
    size_t max_connections;       /**< open client connections; one more is accepted and
                                       closed at once, so fds and memory stay bounded
                                       (default 4096) */
    size_t max_connections_per_ip; /**< open connections from one client address; more are
                                        closed at once (0 = no limit) */
    size_t write_high_water;      /**< bytes pending to the client above which
                                       kvr_http_resp_write() reports "full" (default 65536) */
    uint64_t close_after_requests; /**< test behaviour (kvroute-sim --close-after-requests):
                                       close a connection after this many responses without
                                       announcing it (the last one still says keep-alive), as a
                                       worker whose keep-alive timeout fires just as a response
                                       ends (0 = never, the default) */
} kvr_http_limits;
/* A zero field selects its default. idle_timeout_ms is also the send timeout: a client that
 * accepts no bytes of a pending write for that long is dropped (nginx send_timeout). While the
 * handler owns a request, pipelined input is buffered up to max(64 KiB, max_header_bytes); past
 * that the server stops reading that client (and so cannot see its EOF) until the response
 * ends. Output queued per connection is capped at max(64 MiB, 64 * write_high_water): a handler
 * that ignores backpressure past that gets -1 and the connection is closed. */

/** Fills `l` with the defaults given above. */
void kvr_http_limits_default(kvr_http_limits *l);

/** Called once per complete request (headers and whole body read and validated). The handler
 *  owns `req` from then on and must eventually call kvr_http_resp_end() or kvr_http_resp_abort()
 *  exactly once (possibly later, from another callback); `req` is invalid after that call. */
typedef void (*kvr_http_handler)(kvr_http_req *req, void *ud);

/** Creates a server on `loop`. `limits` is copied. Never returns NULL (aborts on OOM at boot). */
kvr_http_server *kvr_http_server_new(uv_loop_t *loop, const kvr_http_limits *limits,
                                     kvr_http_handler handler, void *ud);
/** Binds and listens on host:port (IPv4 or IPv6 literal). Returns 0 or a negative libuv error.
 *  Port 0 binds an ephemeral port; kvr_http_server_port() tells which. */
int kvr_http_server_listen(kvr_http_server *s, const char *host, int port);
/** The bound port, or -1 when not listening. */
int kvr_http_server_port(const kvr_http_server *s);
/** Stops accepting new connections and closes idle keep-alive connections; connections with a
 *  request in progress finish it and then close (no keep-alive). Used for SIGTERM draining. */
void kvr_http_server_stop_accepting(kvr_http_server *s);
/** Number of client connections not yet fully closed (including ones flushing their last
 *  response): draining is complete when this reaches 0 after stop_accepting. */
size_t kvr_http_server_open_connections(const kvr_http_server *s);
/** Number of requests currently owned by the handler (not yet ended or aborted). */
size_t kvr_http_server_active_requests(const kvr_http_server *s);
/** Requests the HTTP layer itself answered with an error before any handler saw them
 *  (malformed, over a limit, a deadline: 400, 408, 413, 414, 415, 417, 431, 501, 503 for the
 *  body budget). Fills up to `cap` (status, count) pairs, counts since the server started, in the
 *  order each status was first seen; returns how many. */
size_t kvr_http_server_refusals(const kvr_http_server *s, int *status, uint64_t *count,
                                size_t cap);
/** Enough pairs for kvr_http_server_refusals() to list every status it counts. */
#define KVR_HTTP_REFUSALS_MAX 16
/** Closes every connection and the listener; `on_closed` (may be NULL) runs once all libuv
 *  handles are closed, after which the server is freed. Requests still owned by the handler get
 *  their on_client_gone callback first. */
void kvr_http_server_close(kvr_http_server *s, void (*on_closed)(void *ud), void *ud);

/* ---- request accessors (valid until kvr_http_resp_end/abort) ---- */
/** Method as an uppercase NUL-terminated string ("GET", "POST", ...). */
const char *kvr_http_req_method(const kvr_http_req *r);
/** Path of the origin-form target without the query, NUL-terminated (e.g. "/v1/models"). */
const char *kvr_http_req_path(const kvr_http_req *r);
/** The raw request target as sent (path + "?" + query), NUL-terminated. */
const char *kvr_http_req_target(const kvr_http_req *r);
/** 0 for HTTP/1.0, 1 for HTTP/1.1. */
int kvr_http_req_minor_version(const kvr_http_req *r);
/** The body bytes (NUL-terminated for convenience, not counted in `*len`). */
const char *kvr_http_req_body(const kvr_http_req *r, size_t *len);
/** A label the handler attaches to the request (e.g. the client key's name for metrics); the
 *  string is borrowed and must outlive the request. NULL until set; reset per request. */
void kvr_http_req_set_tag(kvr_http_req *r, const char *tag);
const char *kvr_http_req_tag(const kvr_http_req *r);
/** The request's endpoint for metric labels: a path template such as "/v1/responses/{id}",
 *  so that ids in paths never become label values (borrowed; must outlive the request).
 *  kvr_http_req_endpoint() returns it, or the path until one is set; reset per request. */
void kvr_http_req_set_endpoint(kvr_http_req *r, const char *endpoint);
const char *kvr_http_req_endpoint(const kvr_http_req *r);
/** Frees the body now (it then reads as empty) and returns its bytes to the
 *  max_total_body_bytes budget: for a handler that no longer needs it while the response is
 *  still running (a proxied request once its worker answered). */
void kvr_http_req_release_body(kvr_http_req *r);
/** Number of headers and header i (0-based), in the order received; names as sent. */
size_t kvr_http_req_header_count(const kvr_http_req *r);
const kvr_http_header *kvr_http_req_header_at(const kvr_http_req *r, size_t i);
/** First header named `name` (case-insensitive); its value NUL-terminated, or NULL. */
const char *kvr_http_req_header(const kvr_http_req *r, const char *name);
/** The peer address as "ip:port" text, NUL-terminated. */
const char *kvr_http_req_peer(const kvr_http_req *r);
/** Monotonic ns timestamp when the request's first byte arrived. */
uint64_t kvr_http_req_start_ns(const kvr_http_req *r);

/** Callbacks of a request owned by the handler. Both optional. */
typedef struct kvr_http_req_cbs {
    /** The bytes pending to the client fell to or below write_high_water/4 after having been
     *  above write_high_water (resume the producer). */
    void (*on_drain)(void *ud);
    /** The client went away (EOF, reset, write error, send timeout, server close) before the
     *  response ended. The handler must stop producing and still call kvr_http_resp_end() or
     *  _abort(), which then only frees. Called at most once, from the connection's close
     *  callback (the same loop iteration the loss was seen), never from inside a resp_* call:
     *  a resp_* call that finds the client gone returns -1 and the callback follows. */
    void (*on_client_gone)(void *ud);
} kvr_http_req_cbs;
void kvr_http_req_set_cbs(kvr_http_req *r, const kvr_http_req_cbs *cbs, void *ud);
/** True once the client has gone (on_client_gone fired or would have). */
int kvr_http_req_client_gone(const kvr_http_req *r);

/* ---- response ---- */
/** Starts the response: status line plus `n` headers. The server adds Date, Connection and the
 *  framing: with `content_length` >= 0 it sends Content-Length (body must total that many
 *  bytes), with -1 it uses chunked for HTTP/1.1 and close-delimited for HTTP/1.0. Headers named
 *  Content-Length, Transfer-Encoding, Connection, Keep-Alive, Date are ignored in `h`.
 *  Returns 0, or -1 if already started or the client is gone. */
int kvr_http_resp_start(kvr_http_req *r, int status, const kvr_http_header *h, size_t n,
                        int64_t content_length);
/** Queues body bytes (copied; writes are coalesced while one is in flight). Returns 1 when the
 *  bytes pending to the client now exceed write_high_water (the caller should pause until
 *  on_drain), 0 otherwise, -1 if the client is gone or the response not started. Bytes past a
 *  declared Content-Length are dropped (returns -1; the connection closes after the response).
 *  A HEAD, 204 or 304 response discards body bytes. */
int kvr_http_resp_write(kvr_http_req *r, const void *data, size_t len);
/** Bytes queued to the client and not yet written to the socket. */
size_t kvr_http_resp_pending(const kvr_http_req *r);
/** Finishes the response (last chunk for chunked) and releases `r`. The connection is kept for
 *  the next request when keep-alive allows, else closed after flushing. Without a prior
 *  kvr_http_resp_start() the client gets a 500 JSON error; a body shorter than its
 *  Content-Length closes the connection. */
void kvr_http_resp_end(kvr_http_req *r);
/** Ends the response abnormally: the connection is closed after flushing what was queued,
 *  without the terminating chunk, so the client sees a truncated body (before
 *  kvr_http_resp_start(): no response at all). Releases `r`. */
void kvr_http_resp_abort(kvr_http_req *r);
/** Convenience: a complete response with a body of `len` bytes and `content_type`, plus
 *  `n` extra headers; then releases `r` like kvr_http_resp_end(). */
void kvr_http_resp_simple(kvr_http_req *r, int status, const char *content_type,
                          const kvr_http_header *extra, size_t n, const void *body, size_t len);

/** The standard reason phrase for `status` ("OK", "Not Found", ...), or "Unknown". */
const char *kvr_http_reason(int status);

/** 1 when `p[0..n)` are all RFC 9110 §5.6.2 tchar (a header name's bytes); 1 for n = 0. */
int kvr_http_is_token(const char *p, size_t n);

#endif
