/* Private to src/http: the connection, request and server structs shared by server.c (lifecycle,
 * reads, timers), parse.c (http_parser callbacks), validate.c (framing and header rules),
 * response.c (framing and the write path) and request.c (accessors).
 * Symbols that cross these files use the kvr_http__ prefix; nothing here is API. */
#ifndef KVR_HTTP_INTERNAL_H
#define KVR_HTTP_INTERNAL_H
#include <http_parser.h>
#include <stdint.h>
#include <time.h>

#include "http/server.h"
#include "util/buf.h"

/** Bytes read per uv read; one buffer per server, reused for every read (libuv hands the
 *  buffer back before the next alloc, so one loop needs only one). */
#define KVR_HTTP_READ_BUF 65536
/** Minimum bytes of pipelined input buffered while a request is with the handler; past this
 *  the server stops reading (the cap is max(this, max_header_bytes)). */
#define KVR_HTTP_PIPELINE_MIN 65536
/** Lingering close, after nginx's lingering_close: once the last response is flushed the write
 *  side is shut down and input is read and dropped for at most this long (ms) or this many
 *  bytes, so the kernel does not answer unread input with a RST that could destroy the
 *  response before the client has read it. */
#define KVR_HTTP_LINGER_MS 2000
#define KVR_HTTP_LINGER_MAX_BYTES (1u << 20)
/** Buffers that grew past this are freed once idle instead of being kept for reuse. */
#define KVR_HTTP_KEEP_ALLOC (256u * 1024u)

typedef struct kvr_http_conn kvr_http_conn;

/** Connection states. Parsing happens only in IDLE, HEADERS and BODY. */
enum kvr_http_cstate {
    KVR_HTTP_C_IDLE,    /**< between requests; keep-alive idle timer */
    KVR_HTTP_C_HEADERS, /**< request line/headers being read; header deadline */
    KVR_HTTP_C_BODY,    /**< body being read; body deadline */
    KVR_HTTP_C_HANDLER, /**< request owned by the handler; input buffered, not parsed */
    KVR_HTTP_C_CLOSING, /**< last response queued; shut down once flushed */
    KVR_HTTP_C_LINGER,  /**< write side shut down; input dropped until EOF or the linger timer */
    KVR_HTTP_C_CLOSED,  /**< uv_close() called on the handles */
};

/** Response body framing. */
enum kvr_http_framing {
    KVR_HTTP_F_NONE,   /**< no body (HEAD, 204, 304) */
    KVR_HTTP_F_LENGTH, /**< Content-Length */
    KVR_HTTP_F_CHUNKED,
    KVR_HTTP_F_EOF, /**< close-delimited (HTTP/1.0 without a length) */
};

/** States of the header-block pre-scan (validate.c). */
enum kvr_http_scan {
    KVR_HTTP_SCAN_PRE,    /**< skipping empty lines before the request line */
    KVR_HTTP_SCAN_LINE,   /**< inside a line */
    KVR_HTTP_SCAN_CR,     /**< a line's CR ended the previous slice */
    KVR_HTTP_SCAN_BOL,    /**< at the start of a header line */
    KVR_HTTP_SCAN_END_CR, /**< CR of the empty line that ends the block */
    KVR_HTTP_SCAN_DONE,   /**< block complete: nothing more to scan for this request */
};

/** A header as offsets into the request's header buffer while it is still growing. */
typedef struct kvr_http_hoff {
    uint32_t name_off, name_len, value_off, value_len;
} kvr_http_hoff;

struct kvr_http_req {
    kvr_http_conn *conn;
    const char *tag;    /**< the handler's label for this request (kvr_http_req_set_tag) */
    const char *endpoint; /**< its endpoint label (kvr_http_req_set_endpoint), NULL = path */
    /* Request (filled while parsing, read-only for the handler). */
    kvr_buf hbuf; /**< target, names and values, each NUL-terminated; target at offset 0 */
    kvr_http_hoff *offs;
    kvr_http_header *hdrs;
    size_t nhdrs, hcap; /**< used and allocated entries of offs/hdrs (hcap <= max_headers) */
    uint32_t target_len, path_off;
    const char *method;
    int minor;
    int keep_alive; /**< the request allows keep-alive (http_should_keep_alive) */
    int head;
    uint64_t start_ns;
    kvr_buf body;
    size_t body_held; /**< bytes of the server's body_total this request holds: its whole
                           Content-Length from the end of its headers (so concurrent uploads
                           over --max-total-body-bytes refuse the ones that do not fit, first
                           come first served, instead of every one that gets its next bytes
                           at a bad time), or a chunked body's bytes as they arrive */
    /* Handler side. */
    kvr_http_req_cbs cbs;
    void *cbs_ud;
    int owned;       /**< with the handler: between dispatch and resp_end/abort */
    int gone;        /**< client gone (or connection failed) while owned */
    int gone_told;   /**< on_client_gone already called */
    int started;     /**< resp_start done */
    int want_drain;  /**< resp_write reported "full"; on_drain pending */
    int framing;     /**< enum kvr_http_framing */
    int close_after; /**< the response decided the connection must close */
    int64_t resp_len; /**< Content-Length promised, or -1 */
    uint64_t resp_sent; /**< body bytes queued so far */
};

struct kvr_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;  /**< idle / header / body / linger deadline, by state */
    uint64_t deadline;  /**< loop time (ms) of the current deadline; 0 = none */
    uint64_t timer_due; /**< loop time the uv timer is armed for; 0 = not armed */
    uv_timer_t wtimer; /**< write stall: a queued write made no progress for idle_timeout_ms */
    uv_write_t wreq;
    uv_shutdown_t sreq;
    kvr_http_server *srv; /**< NULL once the server was freed with this request still owned */
    kvr_http_conn *prev, *next;   /**< server's list of connections */
    kvr_http_conn *fnext;         /**< server's flush list */
    int in_flush;
    int state;
    int nhandles; /**< libuv handles not yet closed (tcp + 2 timers) */
    http_parser parser;
    kvr_buf in;   /**< unparsed input kept while parsing is paused */
    kvr_buf out;  /**< queued output not yet handed to libuv */
    kvr_buf wbuf; /**< output handed to libuv (one uv_write in flight) */
    int writing;
    int close_after_flush;
    int reading;  /**< uv_read_start active */
    int eof;      /**< the client closed its side */
    uint64_t nresp; /**< responses ended on this connection (close_after_requests) */
    int in_drive; /**< inside conn_drive (guards re-entry from a synchronous resp_end) */
    int wait_out; /**< parsing paused until queued output falls to write_high_water */
    size_t linger_bytes;
    /* Parse state of the current request. */
    const char *slice_end; /**< end of the bytes being parsed (for the chunk CRLF check) */
    int scan_state;
    int scan_first; /**< still in the request line */
    size_t scan_bytes, scan_lines;
    int hs; /**< 0 nothing yet, 1 in a header name, 2 in a header value */
    int headers_done;
    size_t trailer_bytes;
    uint64_t chunk_left;
    int chunk_data_done;
    int crlf_expect; /**< bytes of the CRLF after chunk data still to check (2, 1, 0) */
    int expect_continue;
    int err_status;
    const char *err_msg;
    char peer[64];
    char ip[48];    /**< the client's address without the port (per-address limit) */
    kvr_http_req req;
};

struct kvr_http_server {
    uv_loop_t *loop;
    kvr_http_limits lim;
    size_t pipeline_cap;
    size_t out_cap;
    kvr_http_handler handler;
    void *ud;
    uv_tcp_t listener;
    int listener_state; /**< 0 none, 1 listening, 2 closing/closed */
    int port;
    uv_prepare_t prepare; /**< flushes the connections queued in flush_head before polling */
    kvr_http_conn *flush_head;
    kvr_http_conn *conns;
    size_t active;
    int nhandles; /**< server-level handles (prepare, listener) not yet closed */
    size_t nconns; /**< connections whose handles are not all closed */
    size_t body_total; /**< request body bytes held by all connections (max_total_body_bytes) */
    int draining;
    int closing;
    void (*on_closed)(void *ud);
    void *closed_ud;
    time_t date_sec;
    char date[40];
    struct {
        int status;
        uint64_t n;
    } refused[KVR_HTTP_REFUSALS_MAX]; /**< kvr_http_server_refusals(), by first sight */
    size_t nrefused;
    char rbuf[KVR_HTTP_READ_BUF];
};

/* parse.c */
extern const http_parser_settings kvr_http__settings;
/** Resets the parser and the request for the next message on `c`. */
void kvr_http__parse_reset(kvr_http_conn *c);
/** Parses up to `n` bytes. Returns the bytes consumed; `*res` is 0 (need more), 1 (a complete
 *  request is ready; the parser is paused) or -1 (error; c->err_status/err_msg say which). */
size_t kvr_http__execute(kvr_http_conn *c, const char *p, size_t n, int *res);

/* validate.c */
/** Pre-scans header-block bytes (before http_parser sees them): counts bytes (414/431) and
 *  lines (431), rejects obs-fold and bare CR (400). Returns 0 or the status to answer. */
int kvr_http__scan(kvr_http_conn *c, const char *p, size_t n);
/** 1 for the methods the proxy serves. */
int kvr_http__method_allowed(unsigned method);
/** Request-level rules at the end of the headers. Returns 0 or a status (message in *msg). */
int kvr_http__validate(kvr_http_conn *c, const char **msg);

/* response.c */
/** Queues a server-generated error (OpenAI JSON body, Connection: close) and closes after it. */
void kvr_http__send_error(kvr_http_conn *c, int status, const char *msg);
/** Appends raw bytes to the output queue and schedules a flush; -1 when the queue is full. */
int kvr_http__queue(kvr_http_conn *c, const void *p, size_t n);
/** Schedules the queued output to be written before the loop next polls. */
void kvr_http__flush_later(kvr_http_conn *c);
/** Flushes what is queued, then shuts the write side and lingers. */
void kvr_http__close_after_flush(kvr_http_conn *c);
/** Bytes queued to the client not yet written to the socket. */
size_t kvr_http__pending(const kvr_http_conn *c);
void kvr_http__prepare_cb(uv_prepare_t *h);
void kvr_http__unflush(kvr_http_conn *c);

/* server.c */
/** Closes the connection's handles now; an owned request is marked gone and its
 *  on_client_gone runs from the close callback. */
void kvr_http__conn_close(kvr_http_conn *c);
/** Resumes parsing buffered input after a request was released or output drained. */
void kvr_http__conn_resume(kvr_http_conn *c);
/** Starts the shutdown + lingering phase (output fully flushed). */
void kvr_http__start_shutdown(kvr_http_conn *c);
/** Ends the handler's ownership of `r`; `keep` says whether the connection may be reused. */
void kvr_http__req_release(kvr_http_req *r, int keep);
/** Arms the connection's deadline timer for the current state. */
void kvr_http__arm_timer(kvr_http_conn *c, uint64_t ms);
void kvr_http__stop_timer(kvr_http_conn *c);

#endif
