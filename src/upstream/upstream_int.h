/* Private to src/upstream: the libcurl client (`kvr_upc`, see impl.h) and attempt structures shared by upstream.c (client
 * lifecycle, multi driving, deferred work), sock.c (one uv_poll per curl socket) and attempt.c
 * (one transfer: easy handle, request, response callbacks, deadlines). Internal cross-file
 * symbols use the `kvr_up__` prefix. Everything here runs on the client's loop thread. */
#ifndef KVR_UPSTREAM_UPSTREAM_INT_H
#define KVR_UPSTREAM_UPSTREAM_INT_H
#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "upstream/impl.h"
#include "util/buf.h"

/* Response head bytes kept per attempt: libcurl 7.88 itself refuses more than
 * MAX_HTTP_RESP_HEADER_SIZE (300 KiB, lib/http.h), so this cap is never the binding one. */
#define KVR_UP_HEAD_CAP (300u * 1024u)

/* Buffers above these sizes are released when an attempt goes back to the free list, so one
 * huge request does not pin memory for the life of the process. */
#define KVR_UP_KEEP_BYTES (16u * 1024u)
#define KVR_UP_KEEP_HEADERS 64u

/** Life of an attempt object (objects are recycled through the client's free list). */
typedef enum kvr_up_state {
    KVR_UP_S_FREE,      /* on the free list */
    KVR_UP_S_PENDING,   /* started inside a libcurl callback; added to the multi by the kick */
    KVR_UP_S_RUNNING,   /* in the multi handle, callbacks live */
    KVR_UP_S_KILLED,    /* cancelled inside a libcurl callback; on the kill list */
    KVR_UP_S_FINISHING, /* inside on_done */
    KVR_UP_S_ZOMBIE,    /* released while still queued for the kick, which recycles it */
} kvr_up_state;

typedef struct kvr_usock kvr_usock;
typedef struct kvr_upc_attempt kvr_upc_attempt;

struct kvr_upc_attempt {
    kvr_upstream_attempt hdr; /* first: hdr.native == 0 */
    kvr_upc *u;
    CURL *easy;       /* owned; options that never change are set once at creation */
    uv_timer_t timer; /* first-byte, then stream-idle deadline (lazily re-armed); closed with u */
    kvr_up_state state;
    unsigned in_multi : 1;    /* added to u->multi */
    unsigned queued : 1;      /* on the kick queue */
    unsigned paused : 1;      /* on_body returned 1 and no resume ran yet */
    unsigned resume_req : 1;  /* resume asked for inside a libcurl callback */
    unsigned got_headers : 1; /* on_headers ran */
    unsigned in_block : 1;    /* inside a response head (status line seen, blank line not) */
    unsigned egress_denied : 1; /* the egress hook refused an address of this attempt */
    int status;               /* status of the head being parsed */
    uint64_t start_ms;        /* uv_now() at kvr_upc_start (first-byte deadline) */
    uint64_t last_rx_ms;      /* uv_now() of the last body bytes (or of headers / resume) */
    kvr_upstream_err fail_kind; /* set by our own callbacks when they abort the transfer */
    const char *fail_msg;
    kvr_upstream_cbs cbs;
    void *ud;

    /* Response head: lines are copied into `head`; offsets are turned into pointers in
     * `hdrs` once the block ends (the buffer may move while it grows). */
    kvr_buf head;
    size_t *hoff;          /* 2 per header: name offset, value offset into head.data */
    kvr_http_header *hdrs; /* lengths filled while parsing, pointers at delivery */
    size_t nhdrs, hdrs_cap;

    /* Request head: "Name: value\0" strings and our own curl_slist nodes pointing at them, so
     * no curl_slist_append() allocations per request. */
    char *rq;
    size_t rq_cap;
    struct curl_slist *nodes;
    size_t nodes_cap;

    char errbuf[CURL_ERROR_SIZE];

    kvr_upc_attempt *prev, *next; /* u->active list */
    kvr_upc_attempt *qnext;       /* kick queue */
    kvr_upc_attempt *lnext;       /* kill list or free list (never both) */
};

struct kvr_upc {
    uv_loop_t *loop;
    CURLM *multi;
    kvr_upstream_opts opts;
    uv_timer_t curl_timer; /* CURLMOPT_TIMERFUNCTION */
    uv_idle_t kick;        /* next loop iteration: deferred adds, resumes and failures */
    int depth;             /* > 0 while inside a libcurl call that may run our callbacks */
    int closing;
    size_t active;
    size_t open_handles; /* libuv handles not yet closed; u is freed when this reaches 0 */
    kvr_upc_attempt *active_head;
    kvr_upc_attempt *free_head;
    kvr_upc_attempt *kill_head;
    kvr_upc_attempt *queue_head, *queue_tail;
    kvr_usock **socks; /* fd → its poll (at most one per fd) */
    size_t socks_cap;
    kvr_usock *sock_free;
};

/* ---- upstream.c ---- */
/** Runs curl_multi_socket_action(fd, flags) then drains the kill list and completed transfers. */
void kvr_up__drive(kvr_upc *u, curl_socket_t fd, int flags);
/** Ends a running or pending attempt: removes it from the multi (closing its connection if the
 *  transfer was not complete), runs on_done, recycles. Only with u->depth == 0. */
void kvr_up__finish(kvr_upc_attempt *a, kvr_upstream_err kind, const char *msg);
/** Fails `a` with `kind` on the next loop iteration (for code that runs inside libcurl). */
void kvr_up__fail_later(kvr_upc_attempt *a, kvr_upstream_err kind, const char *msg);
/** Drops one libuv handle from the count and frees the client once closing and none is left. */
void kvr_up__handle_closed(kvr_upc *u);

/* ---- sock.c ---- */
int kvr_up__socket_cb(CURL *e, curl_socket_t s, int what, void *userp, void *socketp);
int kvr_up__closesocket_cb(void *clientp, curl_socket_t s);
/** Closes every remaining poll and frees the pooled ones (client shutdown). */
void kvr_up__socks_shutdown(kvr_upc *u);

/* ---- attempt.c ---- */
/** A new attempt with its easy handle configured from u->opts; NULL on allocation failure. */
kvr_upc_attempt *kvr_up__attempt_new(kvr_upc *u);
/** Sets the per-request options. Returns 0, or -1 (bad header bytes, bad URL scheme, OOM). */
int kvr_up__attempt_prepare(kvr_upc_attempt *a, const char *method, const char *url,
                            const kvr_http_header *h, size_t n, const char *body, size_t len);
/** Arms the deadline timer (first-byte, then stream-idle) for a just-started attempt. */
void kvr_up__attempt_arm(kvr_upc_attempt *a);
/** Re-arms the idle deadline after a resume. */
void kvr_up__attempt_rearm_idle(kvr_upc_attempt *a);
/** Releases oversized buffers before the attempt goes back to the free list. */
void kvr_up__attempt_trim(kvr_upc_attempt *a);
/** Frees the buffers and easy handle and closes the timer; memory goes in its close callback. */
void kvr_up__attempt_destroy(kvr_upc_attempt *a);
/** The kind and text of a finished transfer's result. */
kvr_upstream_err kvr_up__map_result(kvr_upc_attempt *a, CURLcode rc, const char **msg);

#endif
