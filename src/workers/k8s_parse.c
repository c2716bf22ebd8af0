/* EndpointSlice lists and watch events → kvr_k8s_slice (shapes: k8s_parse.h). */
#include "workers/k8s_parse.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_k8s_slice_free(kvr_k8s_slice *s)
{
    free(s->eps);
    s->eps = NULL;
    s->neps = 0;
}

/* Copies a JSON string of at most `cap - 1` bytes; 0 when absent, not a string or too long. */
static int copy_str(json_t *v, char *out, size_t cap)
{
    const char *s = json_string_value(v);
    size_t n = s ? json_string_length(v) : 0;
    if (!s || n >= cap || memchr(s, '\0', n))
        return 0;
    memcpy(out, s, n + 1);
    return 1;
}

/* A pod name as Kubernetes spells one (DNS subdomain: [a-z0-9.-], 1..253): safe in logs,
 * metric labels and admin paths. */
static int dns_name(const char *s)
{
    if (!*s)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
            return 0;
    return 1;
}

/* 1/0 for a JSON boolean, `dflt` for null or absent (anything else is not a condition). */
static int cond(json_t *c, const char *key, int dflt)
{
    json_t *v = json_object_get(c, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int port_number(json_t *p)
{
    json_t *v = json_object_get(p, "port");
    if (!json_is_integer(v))
        return 0;
    json_int_t n = json_integer_value(v);
    return n >= 1 && n <= 65535 ? (int)n : 0;
}

/* The port the selector picks from the slice's `ports` (0 = none). */
static int pick_port(json_t *ports, const char *sel)
{
    if (sel && *sel && strspn(sel, "0123456789") == strlen(sel)) {
        long n = strlen(sel) <= 5 ? strtol(sel, NULL, 10) : 0;
        return n >= 1 && n <= 65535 ? (int)n : 0;
    }
    size_t i;
    json_t *p;
    int first = 0;
    json_array_foreach(ports, i, p)
    {
        const char *name = json_string_value(json_object_get(p, "name"));
        int n = port_number(p);
        if (!n)
            continue;
        if (sel && *sel) {
            if (name && strcmp(name, sel) == 0)
                return n;
            continue;
        }
        if (name && strcmp(name, "http") == 0)
            return n;
        if (!first)
            first = n;
    }
    return first;
}

/* A KV-event port: a number, or a name the slice lists; 0 when unset or not found. */
static int pick_named(json_t *ports, const char *sel)
{
    if (!sel || !*sel)
        return 0;
    return pick_port(ports, sel);
}

/* One endpoint's addresses into s->eps (each address is a worker). */
static void add_endpoint(kvr_k8s_slice *s, json_t *ep, int v6, size_t max_eps)
{
    json_t *addrs = json_object_get(ep, "addresses");
    json_t *c = json_object_get(ep, "conditions");
    json_t *ref = json_object_get(ep, "targetRef");
    int ready = cond(c, "ready", 1);
    kvr_k8s_endpoint e = {
        .ready = ready,
        .serving = cond(c, "serving", ready),
        .terminating = cond(c, "terminating", 0),
    };
    if (!copy_str(json_object_get(ref, "name"), e.name, sizeof(e.name)) || !dns_name(e.name))
        e.name[0] = '\0';
    size_t i;
    json_t *a;
    json_array_foreach(addrs, i, a)
    {
        char ip[INET6_ADDRSTRLEN + 1];
        unsigned char bin[16];
        if (s->neps >= max_eps || !copy_str(a, ip, sizeof(ip)) ||
            inet_pton(v6 ? AF_INET6 : AF_INET, ip, bin) != 1)
            continue;
        /* Written back from the binary form: the URL never holds bytes the API sent. */
        char norm[INET6_ADDRSTRLEN];
        if (!inet_ntop(v6 ? AF_INET6 : AF_INET, bin, norm, sizeof(norm)))
            continue;
        snprintf(e.url, sizeof(e.url), v6 ? "http://[%s]:%d" : "http://%s:%d", norm, s->port);
        e.kv_url[0] = e.kv_replay_url[0] = '\0';
        if (s->kv_port)
            snprintf(e.kv_url, sizeof(e.kv_url), v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", norm,
                     s->kv_port);
        if (s->kv_port && s->kv_replay_port)
            snprintf(e.kv_replay_url, sizeof(e.kv_replay_url),
                     v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", norm, s->kv_replay_port);
        s->eps[s->neps++] = e;
    }
}

/* A slice object → `s` (zeroed first). 0, or -1 when it is not a usable slice. */
static int parse_slice(json_t *o, const kvr_k8s_sel *sel, kvr_k8s_slice *s, char *err,
                       size_t cap)
{
    memset(s, 0, sizeof(*s));
    json_t *md = json_object_get(o, "metadata");
    if (!json_is_object(o) || !copy_str(json_object_get(md, "name"), s->name, sizeof(s->name)) ||
        !s->name[0]) {
        snprintf(err, cap, "an EndpointSlice without a valid metadata.name");
        return -1;
    }
    copy_str(json_object_get(md, "resourceVersion"), s->rv, sizeof(s->rv));
    const char *at = json_string_value(json_object_get(o, "addressType"));
    int v6 = at && strcmp(at, "IPv6") == 0;
    if (at && !v6 && strcmp(at, "IPv4") != 0)
        return 0; /* FQDN: not an address kvroute dials */
    json_t *eps = json_object_get(o, "endpoints");
    s->port = pick_port(json_object_get(o, "ports"), sel->port);
    s->kv_port = pick_named(json_object_get(o, "ports"), sel->kv_port);
    s->kv_replay_port = pick_named(json_object_get(o, "ports"), sel->kv_replay_port);
    if (!s->port || !json_is_array(eps) || !json_array_size(eps))
        return 0;
    size_t n = 0, i;
    json_t *ep;
    json_array_foreach(eps, i, ep)
    {
        size_t k = json_array_size(json_object_get(ep, "addresses"));
        n += k < sel->max_eps ? k : sel->max_eps;
    }
    if (n > sel->max_eps)
        n = sel->max_eps;
    if (!n)
        return 0;
    s->eps = calloc(n, sizeof(*s->eps));
    if (!s->eps) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    json_array_foreach(eps, i, ep)
    {
        if (json_is_object(ep))
            add_endpoint(s, ep, v6, n);
    }
    return 0;
}

int kvr_k8s_parse_list(const char *body, size_t len, const kvr_k8s_sel *sel,
                       kvr_k8s_slice **out, char *rv, char *err, size_t cap)
{
    *out = NULL;
    rv[0] = '\0';
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *items = json_object_get(j, "items");
    if (!json_is_object(j) || !(json_is_array(items) || json_is_null(items) || !items)) {
        snprintf(err, cap, "not an EndpointSliceList (no items array)");
        json_decref(j);
        return -1;
    }
    copy_str(json_object_get(json_object_get(j, "metadata"), "resourceVersion"), rv,
             KVR_K8S_RV_MAX + 1);
    size_t n = json_array_size(items), k = 0, i;
    kvr_k8s_slice *ss = calloc(n ? n : 1, sizeof(*ss));
    if (!ss) {
        snprintf(err, cap, "out of memory");
        json_decref(j);
        return -1;
    }
    json_t *it;
    json_array_foreach(items, i, it)
    {
        char e2[128];
        if (parse_slice(it, sel, &ss[k], e2, sizeof(e2)) == 0)
            k++;
    }
    json_decref(j);
    *out = ss;
    return (int)k;
}

int kvr_k8s_parse_event(const char *line, size_t len, const kvr_k8s_sel *sel, kvr_k8s_event *ev,
                        char *err, size_t cap)
{
    memset(ev, 0, sizeof(*ev));
    json_t *j = json_loadb(line, len, 0, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    json_t *o = json_object_get(j, "object");
    int rc = -1;
    if (!type || !json_is_object(o)) {
        snprintf(err, cap, "not a watch event (type and object)");
        goto out;
    }
    copy_str(json_object_get(json_object_get(o, "metadata"), "resourceVersion"), ev->rv,
             sizeof(ev->rv));
    if (strcmp(type, "ERROR") == 0) {
        ev->type = KVR_K8S_ERROR;
        json_t *code = json_object_get(o, "code");
        json_int_t c = json_is_integer(code) ? json_integer_value(code) : 0;
        ev->code = c > 0 && c < 1000 ? (int)c : 0;
        if (!copy_str(json_object_get(o, "reason"), ev->reason, sizeof(ev->reason)) ||
            !dns_name(ev->reason)) {
            /* kept for logs: letters only */
            const char *r = json_string_value(json_object_get(o, "reason"));
            size_t n = 0;
            for (; r && r[n] && n < sizeof(ev->reason) - 1; n++)
                ev->reason[n] = (r[n] >= 'A' && r[n] <= 'Z') || (r[n] >= 'a' && r[n] <= 'z')
                                    ? r[n] : '?';
            ev->reason[n] = '\0';
        }
        rc = 0;
    } else if (strcmp(type, "BOOKMARK") == 0) {
        ev->type = KVR_K8S_BOOKMARK;
        rc = 0;
    } else {
        if (strcmp(type, "ADDED") == 0)
            ev->type = KVR_K8S_ADDED;
        else if (strcmp(type, "MODIFIED") == 0)
            ev->type = KVR_K8S_MODIFIED;
        else if (strcmp(type, "DELETED") == 0)
            ev->type = KVR_K8S_DELETED;
        else {
            snprintf(err, cap, "unknown watch event type");
            goto out;
        }
        rc = parse_slice(o, sel, &ev->slice, err, cap);
    }
out:
    json_decref(j);
    return rc;
}
