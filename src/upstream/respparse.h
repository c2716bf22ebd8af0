/* The native upstream client's HTTP/1.1 response parser: http_parser (nodejs/http-parser 2.9.4,
 * Debian's libhttp-parser) in response mode behind a pull interface. Each kvr_resp_feed() call
 * returns at most one event (the final head, one piece of decoded body, the end of the
 * response, an error), so the caller can stop anywhere (a consumer refusing body bytes) and
 * continue later from the bytes it kept, and it never copies body bytes: a BODY event points
 * into the bytes given.
 *
 * Framing is RFC 9112's as http_parser implements it (§6): Transfer-Encoding chunked (chunk
 * extensions and trailer fields accepted and dropped; the body events carry the decoded bytes),
 * else Content-Length, else the body runs to the close of the connection (kvr_resp_eof());
 * 1xx interim responses are skipped (§15.2 of RFC 9110: a client must accept any number of them
 * before the final one); 204, 304 and responses to HEAD have no body. A malformed status line,
 * header, chunk size or Content-Length, Content-Length together with chunked, or a 101
 * (kvroute never asks to switch protocols) is an error.
 *
 * Header names and values are copied (a head may span several reads whose buffer is reused)
 * into one buffer capped at KVR_RESP_HEAD_CAP; headers are delivered with surrounding blanks
 * trimmed, trailers are not delivered.
 *
 * Fast path: the usual answer (an HTTP/1.1 2xx-5xx head, whole in the first bytes fed, plain
 * token names and printable values, one Content-Length > 0, no Transfer-Encoding) is read by
 * a few memchr-driven lines instead of http_parser's byte-at-a-time state machine (12 % of a
 * small request's instructions), and its body is counted off. Anything else, or any doubt,
 * goes to http_parser from the first byte, so both paths give the same events (the fuzz
 * harness compares them). */
#ifndef KVR_UPSTREAM_RESPPARSE_H
#define KVR_UPSTREAM_RESPPARSE_H
#include <http_parser.h>
#include <stddef.h>

#include "http/server.h" /* kvr_http_header */
#include "util/buf.h"

/** Response head bytes kept (names and values): the libcurl client's limit too (libcurl
 *  7.88's MAX_HTTP_RESP_HEADER_SIZE, lib/http.h), so both clients accept the same heads.
 *  http_parser's own limit (HTTP_MAX_HEADER_SIZE, 80 KiB, raised process-wide by the inbound
 *  server) applies as well. */
#define KVR_RESP_HEAD_CAP (300u * 1024u)

/** What kvr_resp_feed() found. */
typedef enum kvr_resp_ev {
    KVR_RESP_MORE,  /**< every byte given was consumed; feed more (or kvr_resp_eof()) */
    KVR_RESP_HEAD,  /**< the final head is complete: kvr_resp.status, .hdrs, .nhdrs */
    KVR_RESP_BODY,  /**< *piece / *piece_len: decoded body bytes (inside the bytes given) */
    KVR_RESP_DONE,  /**< the response ended; bytes after it were not consumed */
    KVR_RESP_ERROR, /**< malformed response: kvr_resp.err says why (the parser is dead) */
} kvr_resp_ev;

/** One response being parsed. Plain data: zero it or kvr_resp_init() it; kvr_resp_free()
 *  releases the head buffers. Not shared between threads. */
typedef struct kvr_resp {
    http_parser p;
    int status;            /**< status of the final head (after KVR_RESP_HEAD) */
    int head_done;         /**< the final head was returned */
    int done;              /**< KVR_RESP_DONE was returned */
    int skip_body;         /**< the request was HEAD: the response has no body */
    int in_value;          /**< the last header callback was a value fragment */
    int failed;            /**< an error was returned */
    const char *err;       /**< why, when failed (a static string) */
    kvr_http_header *hdrs; /**< the final head's fields, valid until the next reset/free */
    size_t nhdrs;
    /* private */
    kvr_buf head;          /* names and values, back to back */
    size_t *hoff;          /* per header: name offset, value offset into head.data */
    size_t hcap;
    int ev;                /* event set by a callback (kvr_resp_ev), -1 = none */
    const char *piece;
    size_t piece_len;
    int fed;               /* http_parser has seen bytes of this response */
    int fast;              /* the fast path read the head: the body is counted, not parsed */
    int fast_close;        /* ... and Connection named close */
    unsigned long long remaining; /* ... body bytes still to come */
} kvr_resp;

/** Turns the fast path on (the default) or off, process-wide: for tests comparing it with
 *  http_parser. */
void kvr_resp_fast_path(int on);

/** Initialises an empty parser (no allocation until a head arrives). */
void kvr_resp_init(kvr_resp *r);
/** Prepares `r` for a new response (keeping its buffers); `head_request` says the request was
 *  HEAD, whose response carries no body whatever its headers say (RFC 9110 §9.3.2). */
void kvr_resp_reset(kvr_resp *r, int head_request);
/** Releases the buffers (the object may be reset and used again). */
void kvr_resp_free(kvr_resp *r);
/** Releases buffers that grew beyond `keep_bytes` / `keep_headers`. */
void kvr_resp_trim(kvr_resp *r, size_t keep_bytes, size_t keep_headers);

/** Parses from `data` (`len` bytes, may be 0 only after an earlier MORE) and returns the next
 *  event; *used is how many bytes were consumed (the caller gives the rest again next time).
 *  For BODY, *piece / *piece_len point inside data[0, *used). After DONE or ERROR the parser
 *  returns the same event again. */
kvr_resp_ev kvr_resp_feed(kvr_resp *r, const char *data, size_t len, size_t *used,
                          const char **piece, size_t *piece_len);
/** The connection was closed after everything fed was consumed: DONE when the response is
 *  read-to-close and its head arrived (RFC 9112 §6.3 rule 8), else ERROR with err set ("closed
 *  before the response ended"). */
kvr_resp_ev kvr_resp_eof(kvr_resp *r);
/** Dry run right after KVR_RESP_HEAD: parses `data` (the rest of the same read) with a copy of
 *  the parser and reports whether it contains an error (malformed chunk size, bytes after the
 *  end of the response...). Returns 0 when nothing wrong is seen, -1 with *why set otherwise.
 *  It lets the caller fail a response whose first read is already malformed before it relays
 *  its head (so the client can still get a clean 502). `r` is not changed. */
int kvr_resp_check_rest(const kvr_resp *r, const char *data, size_t len, const char **why);
/** Whether the connection may carry another request after DONE (http_should_keep_alive():
 *  HTTP/1.1 without Connection: close, or HTTP/1.0 with keep-alive; never read-to-close). */
int kvr_resp_keep_alive(const kvr_resp *r);

#endif
