/* libcurl sockets on the libuv loop: one uv_poll per curl socket (CURLMOPT_SOCKETFUNCTION, the
 * pattern of curl's docs/examples/multi-uv.c) with the fixes of reference B.5 #5:
 *  - an fd-indexed table is the single owner of polls, so one fd never gets two polls
 *    (libuv issues #2387, #1495); curl_multi_assign() carries the same pointer for libcurl;
 *  - a poll lives as long as its socket: CURL_POLL_REMOVE only "parks" it (libcurl sends that
 *    whenever a transfer ends and its connection goes back to the pool), and the poll is
 *    stopped and closed in the close-socket callback (CURLOPT_CLOSESOCKETFUNCTION, set on every
 *    easy handle, so libcurl calls it for each socket it opened), before the fd is closed:
 *    libuv 1.44.2 aborts when epoll_ctl fails on an fd closed while armed;
 *  - a poll error is passed on as readable+writable, not CURL_CSELECT_ERR: libcurl then does
 *    the recv/send itself and meets the real error (ECONNRESET...), which lets it apply its
 *    own rule for a reused connection that died before any response byte (retry once on a
 *    fresh connection, as the curl tool does) instead of failing with "select/poll returned
 *    error". A worker that closes idle keep-alive connections otherwise turns into 502s.
 * Why park instead of close: re-creating the poll per transfer cost an ioctl(FIONBIO) and an
 * epoll_ctl ADD+DEL probe (uv_poll_init) plus a DEL+ADD (libuv 1.44's uv_poll_start always
 * stops first) and a DEL (uv_poll_stop), i.e. ~2.6 epoll_ctl per proxied request where nginx
 * has none. Now uv_poll_start runs only when the mask libcurl asks for changes, and a parked
 * poll keeps its read interest armed (un-ref'd, so idle pooled connections do not keep the
 * loop alive): an idle connection is not readable, and when it becomes so (the worker closed
 * it, or sent stray bytes) poll_cb stops the poll so the level-triggered EOF cannot spin the
 * loop; libcurl notices the dead connection on its next reuse. A parked poll never keeps write
 * interest (an idle socket is always writable).
 * Closed poll objects are pooled so that a new connection does not cost a malloc. */
#include <stdlib.h>
#include <unistd.h>

#include "upstream/upstream_int.h"
#include "util/log.h"

struct kvr_usock {
    uv_poll_t poll;
    curl_socket_t fd;
    kvr_upc *u;
    int events;          /* UV_READABLE | UV_WRITABLE armed now; 0 = stopped */
    int parked;          /* libcurl sent CURL_POLL_REMOVE: no transfer watches the socket */
    kvr_usock *next_free;
};

static kvr_usock *lookup(kvr_upc *u, curl_socket_t fd)
{
    return fd >= 0 && (size_t)fd < u->socks_cap ? u->socks[fd] : NULL;
}

static void poll_cb(uv_poll_t *p, int status, int events)
{
    kvr_usock *k = p->data;
    int flags = 0;
    if (k->parked) {
        /* Nobody in libcurl waits on this socket: an idle pooled connection that the worker
         * closed (EOF) or that got stray bytes. Stop watching until libcurl asks again. */
        uv_poll_stop(&k->poll);
        k->events = 0;
        return;
    }
    if (status < 0)
        flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
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
    kvr_upc *u = k->u;
    if (u->closing) {
        free(k);
    } else {
        k->next_free = u->sock_free;
        u->sock_free = k;
    }
    kvr_up__handle_closed(u);
}

static void sock_close(kvr_upc *u, kvr_usock *k)
{
    u->socks[k->fd] = NULL;
    uv_poll_stop(&k->poll);
    uv_close((uv_handle_t *)&k->poll, sock_closed);
}

/* CURL_POLL_REMOVE: keep the poll for the socket's next transfer (see the top of the file). */
static void sock_park(kvr_usock *k)
{
    k->parked = 1;
    if (k->events & UV_WRITABLE) {
        uv_poll_stop(&k->poll);
        k->events = 0;
    }
    uv_unref((uv_handle_t *)&k->poll);
}

static kvr_usock *sock_open(kvr_upc *u, curl_socket_t fd)
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
    k->events = 0;
    k->parked = 0;
    u->socks[fd] = k;
    u->open_handles++;
    return k;
}

int kvr_up__socket_cb(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
    kvr_upc *u = userp;
    if (s < 0)
        return 0;
    kvr_usock *k = lookup(u, s);
    if (what == CURL_POLL_REMOVE) {
        if (k && !k->parked)
            sock_park(k);
        return 0;
    }
    if (!k) {
        k = sock_open(u, s);
        if (!k) {
            /* Fail only this transfer (returning -1 would kill the whole multi handle). */
            kvr_upc_attempt *a = NULL;
            if (e && curl_easy_getinfo(e, CURLINFO_PRIVATE, &a) == CURLE_OK && a)
                kvr_up__fail_later(a, KVR_UP_OTHER, "cannot watch the upstream socket");
            return 0;
        }
    }
    if (socketp != k)
        curl_multi_assign(u->multi, s, k);
    if (k->parked) {
        k->parked = 0;
        uv_ref((uv_handle_t *)&k->poll);
    }
    int ev = 0;
    if (what & CURL_POLL_IN)
        ev |= UV_READABLE;
    if (what & CURL_POLL_OUT)
        ev |= UV_WRITABLE;
    if (ev != k->events) {
        /* libuv 1.44: always an epoll_ctl DEL, then an ADD on the next loop iteration */
        if (ev)
            uv_poll_start(&k->poll, ev, poll_cb);
        else
            uv_poll_stop(&k->poll);
        k->events = ev;
    }
    return 0;
}

int kvr_up__closesocket_cb(void *clientp, curl_socket_t s)
{
    kvr_upc *u = clientp;
    kvr_usock *k = lookup(u, s);
    if (k)
        sock_close(u, k);
    return close(s);
}

void kvr_up__socks_shutdown(kvr_upc *u)
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
