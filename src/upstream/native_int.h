/* Private to the native upstream client (native.c: attempts, request, response relay,
 * deadlines; npool.c: per-worker keep-alive pools, connecting, reading, writing). Internal
 * cross-file symbols use the `kvr_upn__` prefix. Everything runs on the client's loop thread.
 *
 * Ownership: the client owns its hosts (one per worker authority, kept until the client
 * closes), each host its connections, each connection at most one attempt at a time (no
 * pipelining). An attempt is recycled through the client's free list once it ended; a
 * connection is freed in the close callback of its last libuv handle. */
#ifndef KVR_UPSTREAM_NATIVE_INT_H
#define KVR_UPSTREAM_NATIVE_INT_H
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "upstream/impl.h"
#include "upstream/respparse.h"
#include "util/buf.h"

/** Read buffer of a busy connection: one read of a response goes here and is parsed in place
 *  (the body is handed to on_body from it, never copied). 64 KiB: loopback and LAN reads of a
 *  streamed body fill it. A connection holds one only while it serves an attempt (idle ones
 *  read into a small scratch buffer, only to see the worker close them), so memory follows
 *  the requests in flight, not the pool or the response sizes. */
#define KVR_UPN_RBUF (64u * 1024u)
/** Read buffers kept for reuse by the client (more are freed). */
#define KVR_UPN_RBUF_KEEP 64u
/** Request head and header buffers above these sizes are released when an attempt is
 *  recycled (as the libcurl client does). */
#define KVR_UPN_KEEP_BYTES (16u * 1024u)
#define KVR_UPN_KEEP_HEADERS 64u

typedef struct upn_host upn_host;
typedef struct upn_conn upn_conn;
typedef struct upn_attempt upn_attempt;

typedef enum upn_astate {
    UPN_A_FREE,      /* on the free list */
    UPN_A_WAITING,   /* queued on its host for a connection (max_host_connections) */
    UPN_A_CONNECTING, /* a new connection is being opened for it */
    UPN_A_ACTIVE,    /* request written / response being read on a->c */
    UPN_A_FINISHING, /* inside on_done */
    UPN_A_DEAD,      /* cancelled inside one of its own callbacks: recycled on the way out */
    UPN_A_ZOMBIE,    /* ended while still on the kick queue, which recycles it */
} upn_astate;

struct upn_attempt {
    kvr_upstream_attempt hdr; /* first: hdr.native == 1 */
    kvr_upn *u;
    upn_host *host;
    upn_conn *c;
    uv_timer_t timer;        /* first-byte, then stream-idle deadline (lazily re-armed) */
    upn_astate state;
    unsigned in_cb;          /* > 0 while one of its callbacks runs */
    unsigned got_headers : 1;
    unsigned got_bytes : 1;  /* a response byte arrived on the current connection */
    unsigned paused : 1;     /* on_body refused `held`; reading is stopped */
    unsigned sent : 1;       /* the whole request was written */
    unsigned resent : 1;     /* already re-sent once after a stale pooled connection */
    unsigned eof : 1;        /* the worker closed the connection (after the buffered bytes) */
    unsigned is_head : 1;    /* a HEAD request: the response has no body */
    unsigned queued : 1;     /* on the client's kick queue */
    unsigned resume_req : 1; /* a resume asked for inside a callback */
    unsigned acquire_req : 1; /* a connection is to be found on the next kick */
    unsigned on_wait : 1;    /* on its host's wait queue */
    kvr_upstream_err fail_kind; /* a failure to report from the kick */
    const char *fail_msg;
    uint64_t start_ms, last_rx_ms;
    uint64_t write_ms;       /* when the request was written on the current connection */
    kvr_upstream_cbs cbs;
    void *ud;
    const char *body;        /* the caller's body: not copied, valid until on_done/cancel */
    size_t body_len;
    kvr_buf req;             /* request head, built once per attempt */
    kvr_buf url;             /* the URL as given, NUL-terminated (for the egress hook) */
    kvr_resp resp;
    const char *held;        /* refused body bytes (inside c->rbuf), redelivered first */
    size_t held_len;
    char errmsg[128];
    upn_attempt *prev, *next; /* the client's active list */
    upn_attempt *wnext;       /* the host's wait queue */
    upn_attempt *qnext;       /* the kick queue */
    upn_attempt *lnext;       /* the free list */
};

typedef enum upn_cstate {
    UPN_C_RESOLVING,
    UPN_C_CONNECTING,
    UPN_C_ACTIVE, /* serving c->a */
    UPN_C_IDLE,   /* in its host's pool */
    UPN_C_CLOSED, /* handles closing; freed when the last one is closed */
} upn_cstate;

/* One TCP handle (a connection tries one per address). Allocated per try, freed in its close
 * callback, so a next address can be tried while the last handle is still closing. */
typedef struct upn_sock {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_write_t wreq;
    upn_conn *c;
} upn_sock;

struct upn_conn {
    kvr_upn *u;
    upn_host *host;
    upn_attempt *a;          /* the attempt it serves (NULL while idle) */
    upn_sock *s;             /* the current TCP handle, NULL before the first try */
    uv_timer_t timer;        /* connect deadline, then the pool's idle deadline */
    uv_getaddrinfo_t gai;
    upn_cstate state;
    unsigned refs;           /* open libuv handles and requests; freed at 0 once closed */
    unsigned reused : 1;     /* it served a request before the current one */
    unsigned reading : 1;
    unsigned writing : 1;
    unsigned gai_busy : 1;
    unsigned denied : 1;     /* the egress hook refused an address of it */
    unsigned tried_lit : 1;  /* the host's literal address was tried */
    unsigned release_pending : 1; /* kept for reuse while its last write's callback is due:
                                   * released (pool or waiter) from that callback */
    uint64_t nreq;           /* requests written on it */
    struct addrinfo *ai, *ai_next; /* resolved addresses, the next one to try */
    int last_err;            /* libuv error of the last failed try */
    char *rbuf;              /* KVR_UPN_RBUF bytes while serving an attempt, else NULL */
    size_t roff, rlen;       /* unparsed bytes: rbuf[roff, roff + rlen) */
    upn_conn *prev, *next;   /* the host's idle list */
};

struct upn_host {
    upn_host *next;
    char *authority;         /* "host[:port]" as in the URL: the Host header and the key */
    size_t authority_len;
    char *name;              /* host name or address literal, without brackets */
    char port[8];
    struct sockaddr_storage lit; /* the address, when `name` is a literal */
    int is_lit;
    size_t nconns;           /* open connections (resolving, connecting, active or idle) */
    size_t nidle;
    upn_conn *idle_head;     /* most recently used first */
    upn_attempt *wait_head, *wait_tail;
};

struct kvr_upn {
    uv_loop_t *loop;
    kvr_upstream_opts opts;
    uv_idle_t kick;          /* next loop iteration: deferred acquires, resumes, failures */
    int closing;
    int depth;               /* > 0 while a callback into the caller runs */
    size_t active;
    size_t open_handles;     /* kick + attempt timers + connections; u freed at 0 */
    upn_host *hosts;
    upn_attempt *active_head;
    upn_attempt *free_head;
    upn_attempt *queue_head, *queue_tail;
    void *rbuf_free;         /* spare read buffers (the first pointer of each links the next) */
    size_t nrbuf_free;
    char scratch[64];        /* what idle connections read into (then they are closed) */
};

/* ---- native.c ---- */
/** A connection for `a` is ready (fresh or pooled): write the request, start reading. */
void kvr_upn__use_conn(upn_attempt *a, upn_conn *c);
/** Parses and relays what the connection has buffered (and its EOF); called by the reader. */
void kvr_upn__drive(upn_attempt *a);
/** The connection failed before it could serve `a` (connect error, timeout, denied). */
void kvr_upn__conn_failed(upn_attempt *a, kvr_upstream_err kind, const char *msg);
/** The connection broke (read error, EOF or write error) while serving `a`. */
void kvr_upn__conn_broke(upn_attempt *a, int uverr);
/** Queues `a` for the kick (next loop iteration). */
void kvr_upn__enqueue(upn_attempt *a);
/** Drops one open handle of the client and frees it once closing and none is left. */
void kvr_upn__handle_closed(kvr_upn *u);

/* ---- npool.c ---- */
/** The host of `authority` (created on first use); NULL when the name does not parse. */
upn_host *kvr_upn__host(kvr_upn *u, const char *authority, size_t len);
/** Finds a connection for `a`: an idle one (then kvr_upn__use_conn runs before this
 *  returns), a new one (connecting), or a place in the host's wait queue. */
void kvr_upn__acquire(upn_attempt *a, int fresh_only);
/** `a` ended with `c` reusable or not: back to the pool (or to the next waiter), or closed. */
void kvr_upn__release(upn_conn *c, int keep);
/** Closes a connection (any state); the attempt it served, if any, is detached first. */
void kvr_upn__conn_close(upn_conn *c);
/** Takes `a` off its host's wait queue (no-op when not there). */
void kvr_upn__unwait(upn_attempt *a);
/** Starts/stops reading the connection's socket. */
void kvr_upn__read_start(upn_conn *c);
void kvr_upn__read_stop(upn_conn *c);
/** Writes the request head and body (one vectored write); 0 or a libuv error. */
int kvr_upn__write(upn_conn *c, const char *head, size_t hlen, const char *body, size_t blen);
/** A read buffer from the client's spares or malloc; NULL when out of memory. */
char *kvr_upn__rbuf_get(kvr_upn *u);
/** Gives a read buffer back (kept as a spare or freed). NULL is a no-op. */
void kvr_upn__rbuf_put(kvr_upn *u, char *b);
/** Closes every host's connections and frees the hosts (client shutdown). */
void kvr_upn__hosts_shutdown(kvr_upn *u);

#endif
