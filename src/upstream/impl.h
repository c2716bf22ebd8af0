/* Private to src/upstream: the two clients behind the public kvr_upstream interface and what
 * front.c needs to dispatch to them. The libcurl client (upstream.c, attempt.c, sock.c) is
 * `kvr_upc`, the native HTTP/1.1 client (native.c, npool.c, respparse.c) is `kvr_upn`; each
 * one's attempt object begins with a kvr_upstream_attempt, whose only field says which client
 * owns it, so an attempt handle is dispatched without a lookup. Same-named functions have the
 * public functions' contracts (upstream.h). */
#ifndef KVR_UPSTREAM_IMPL_H
#define KVR_UPSTREAM_IMPL_H
#include "upstream/upstream.h"

/** The first member of both clients' attempt objects. */
struct kvr_upstream_attempt {
    unsigned char native; /**< 1: a kvr_upn attempt, 0: a kvr_upc (libcurl) one */
};

typedef struct kvr_upc kvr_upc;
typedef struct kvr_upn kvr_upn;

/* ---- the libcurl client (upstream.c) ---- */
kvr_upc *kvr_upc_new(uv_loop_t *loop, const kvr_upstream_opts *opts);
void kvr_upc_close(kvr_upc *u);
kvr_upstream_attempt *kvr_upc_start(kvr_upc *u, const char *method, const char *url,
                                    const kvr_http_header *h, size_t n, const char *body,
                                    size_t len, const kvr_upstream_cbs *cbs, void *ud);
void kvr_upc_resume(kvr_upstream_attempt *a);
void kvr_upc_cancel(kvr_upstream_attempt *a);
int kvr_upc_body_sent(kvr_upstream_attempt *a, size_t len);
size_t kvr_upc_active(const kvr_upc *u);

/* ---- the native client (native.c) ---- */
kvr_upn *kvr_upn_new(uv_loop_t *loop, const kvr_upstream_opts *opts);
void kvr_upn_close(kvr_upn *u);
/** 1 when the native client can serve `url`: http:// with no userinfo; anything else
 *  (https://, user:pass@) goes to libcurl. */
int kvr_upn_serves(const char *url);
kvr_upstream_attempt *kvr_upn_start(kvr_upn *u, const char *method, const char *url,
                                    const kvr_http_header *h, size_t n, const char *body,
                                    size_t len, const kvr_upstream_cbs *cbs, void *ud);
void kvr_upn_resume(kvr_upstream_attempt *a);
void kvr_upn_cancel(kvr_upstream_attempt *a);
int kvr_upn_body_sent(kvr_upstream_attempt *a, size_t len);
size_t kvr_upn_active(const kvr_upn *u);

/* ---- shared (attempt.c) ---- */
/** 1 when a request header may be sent as given: a non-empty name of token bytes without
 *  ':' or blanks, a value without control bytes other than HT (no header splitting). */
int kvr_up__header_ok(const kvr_http_header *h);

#endif
