/* libcurl sockets on the libuv loop: one uv_poll per curl socket (CURLMOPT_SOCKETFUNCTION, the
 * pattern of curl's docs/examples/multi-uv.c) with the fixes of reference B.5 #5:
 *  - an fd-indexed table is the single owner of polls, so one fd never gets two polls
 *    (libuv issues #2387, #1495); curl_multi_assign() carries the same pointer for libcurl;
 *  - CURL_POLL_REMOVE stops and closes the poll before libcurl closes the fd (libuv 1.44.2
 *    aborts when epoll_ctl fails on an fd closed while armed), and the close-socket callback
 *    does the same if a socket is ever closed without a REMOVE;
 *  - a poll error is passed on as CURL_CSELECT_ERR.
 * Closed poll objects are pooled: a paused transfer drops its poll and gets one back on
 * resume, and that must not cost a malloc each time. */
#include <stdlib.h>
#include <unistd.h>

#include "upstream/upstream_int.h"
#include "util/log.h"

struct kvr_usock {
    uv_poll_t poll;
    curl_socket_t fd;
    kvr_upstream *u;
    kvr_usock *next_free;
};

static kvr_usock *lookup(kvr_upstream *u, curl_socket_t fd)
{
    return fd >= 0 && (size_t)fd < u->socks_cap ? u->socks[fd] : NULL;
}

static void poll_cb(uv_poll_t *p, int status, int events)
{
    kvr_usock *k = p->data;
    int flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    else {
        if (events & UV_READABLE)
            flags |= CURL_CSELECT_IN;
        if (events & UV_WRITABLE)
            flags |= CURL_CSELECT_OUT;
    }
    kvr_up__drive(k->u, k->fd, flags);
}

static void sock_closed(uv_handle_t *h)
{
    kvr_usock *k = h->data;
    kvr_upstream *u = k->u;
    if (u->closing) {
        free(k);
    } else {
        k->next_free = u->sock_free;
        u->sock_free = k;
    }
    kvr_up__handle_closed(u);
}

static void sock_close(kvr_upstream *u, kvr_usock *k)
{
    u->socks[k->fd] = NULL;
    uv_poll_stop(&k->poll);
    uv_close((uv_handle_t *)&k->poll, sock_closed);
}

static kvr_usock *sock_open(kvr_upstream *u, curl_socket_t fd)
{
    if ((size_t)fd >= u->socks_cap) {
        size_t n = u->socks_cap ? u->socks_cap : 64;
        while (n <= (size_t)fd)
            n *= 2;
        kvr_usock **t = realloc(u->socks, n * sizeof(*t));
        if (!t)
            return NULL;
        for (size_t i = u->socks_cap; i < n; i++)
            t[i] = NULL;
        u->socks = t;
        u->socks_cap = n;
    }
    kvr_usock *k = u->sock_free;
    if (k)
        u->sock_free = k->next_free;
    else if (!(k = malloc(sizeof(*k))))
        return NULL;
    int rc = uv_poll_init_socket(u->loop, &k->poll, fd);
    if (rc < 0) {
        KVR_WARN("upstream: uv_poll_init fd=%d: %s", (int)fd, uv_strerror(rc));
        k->next_free = u->sock_free;
        u->sock_free = k;
        return NULL;
    }
    k->poll.data = k;
    k->fd = fd;
    k->u = u;
    u->socks[fd] = k;
    u->open_handles++;
    return k;
}

int kvr_up__socket_cb(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
    kvr_upstream *u = userp;
    if (s < 0)
        return 0;
    kvr_usock *k = lookup(u, s);
    if (what == CURL_POLL_REMOVE) {
        if (k)
            sock_close(u, k);
        return 0;
    }
    if (!k) {
        k = sock_open(u, s);
        if (!k) {
            /* Fail only this transfer (returning -1 would kill the whole multi handle). */
            kvr_upstream_attempt *a = NULL;
            if (e && curl_easy_getinfo(e, CURLINFO_PRIVATE, &a) == CURLE_OK && a)
                kvr_up__fail_later(a, KVR_UP_OTHER, "cannot watch the upstream socket");
            return 0;
        }
    }
    if (socketp != k)
        curl_multi_assign(u->multi, s, k);
    int ev = 0;
    if (what & CURL_POLL_IN)
        ev |= UV_READABLE;
    if (what & CURL_POLL_OUT)
        ev |= UV_WRITABLE;
    uv_poll_start(&k->poll, ev, poll_cb);
    return 0;
}

int kvr_up__closesocket_cb(void *clientp, curl_socket_t s)
{
    kvr_upstream *u = clientp;
    kvr_usock *k = lookup(u, s);
    if (k)
        sock_close(u, k);
    return close(s);
}

void kvr_up__socks_shutdown(kvr_upstream *u)
{
    for (size_t i = 0; i < u->socks_cap; i++)
        if (u->socks[i])
            sock_close(u, u->socks[i]);
    free(u->socks);
    u->socks = NULL;
    u->socks_cap = 0;
    while (u->sock_free) {
        kvr_usock *k = u->sock_free;
        u->sock_free = k->next_free;
        free(k);
    }
}
