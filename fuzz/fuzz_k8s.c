/* libFuzzer harness for the Kubernetes EndpointSlice parser (src/workers/k8s_parse.c): any
 * bytes an API server (or something posing as one) sends, as a list body or as watch event
 * lines, must never crash, leak or invoke undefined behaviour. Every URL it yields must be
 * "http://" + an address inet_pton accepts + ":" + a port in 1..65535, and every name a DNS
 * name or empty: they reach logs, metric labels and connections. */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "workers/k8s_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_slice(const kvr_k8s_slice *s)
{
    for (size_t i = 0; i < s->neps; i++) {
        const kvr_k8s_endpoint *e = &s->eps[i];
        if (strncmp(e->url, "http://", 7) != 0)
            abort();
        char host[80];
        const char *h = e->url + 7, *colon = strrchr(h, ':');
        if (!colon)
            abort();
        int v6 = h[0] == '[';
        size_t n = (size_t)(colon - h) - (v6 ? 2 : 0);
        if (n >= sizeof(host))
            abort();
        memcpy(host, h + v6, n);
        host[n] = '\0';
        unsigned char bin[16];
        if (inet_pton(v6 ? AF_INET6 : AF_INET, host, bin) != 1)
            abort();
        long port = strtol(colon + 1, NULL, 10);
        if (port < 1 || port > 65535)
            abort();
        /* KV-event endpoints: tcp:// + the same address, or empty */
        if (e->kv_url[0] && (strncmp(e->kv_url, "tcp://", 6) != 0 ||
                             strncmp(e->kv_url + 6, h, (size_t)(colon - h)) != 0))
            abort();
        if (e->kv_replay_url[0] && !e->kv_url[0])
            abort();
        for (const char *p = e->name; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const ports[] = {NULL, "http", "8000", "0", "99999"};
    kvr_k8s_sel sel = {ports[size % 5], size % 7 ? 1000 : 1, ports[(size / 5) % 5],
                       ports[(size / 25) % 5]};
    char err[128], rv[KVR_K8S_RV_MAX + 1];
    kvr_k8s_slice *ss;
    int n = kvr_k8s_parse_list((const char *)data, size, &sel, &ss, rv, err, sizeof(err));
    for (int i = 0; i < n; i++) {
        check_slice(&ss[i]);
        kvr_k8s_slice_free(&ss[i]);
    }
    if (n >= 0)
        free(ss);
    /* As watch lines: every newline-separated piece. */
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        kvr_k8s_event ev;
        if (kvr_k8s_parse_event(p, len, &sel, &ev, err, sizeof(err)) == 0) {
            check_slice(&ev.slice);
            kvr_k8s_slice_free(&ev.slice);
        }
        p += len + 1;
    }
    return 0;
}
