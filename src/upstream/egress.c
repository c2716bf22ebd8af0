/* Egress policy (see egress.h). */
#include "upstream/egress.h"

#include <arpa/inet.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rule {
    char *text;       /* as written, for messages */
    int is_glob;
    int family;       /* AF_INET / AF_INET6 for address rules */
    uint8_t addr[16];
    int prefix;       /* bits */
} rule;

typedef struct list {
    rule *r;
    size_t n;
} list;

struct kvr_egress {
    list allow, deny;
};

/* "a.b.c.d", "a.b.c.d/n", "v6", "v6/n" → an address rule; else 0. */
static int parse_addr(const char *s, rule *out, int *bad)
{
    char buf[128];
    *bad = 0;
    if (strlen(s) >= sizeof(buf))
        return 0;
    strcpy(buf, s);
    char *slash = strchr(buf, '/');
    if (slash)
        *slash = '\0';
    int fam = strchr(buf, ':') ? AF_INET6 : AF_INET;
    if (inet_pton(fam, buf, out->addr) != 1) {
        /* Looks like an address but is not one ("10.0.0.300/8"): an error, not a glob. */
        *bad = slash != NULL || strspn(buf, "0123456789.") == strlen(buf);
        return 0;
    }
    int max = fam == AF_INET ? 32 : 128;
    out->family = fam;
    out->prefix = max;
    if (slash) {
        char *end;
        long p = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || p < 0 || p > max) {
            *bad = 1;
            return 0;
        }
        out->prefix = (int)p;
    }
    return 1;
}

static void add_rules(list *l, const char *const *items, size_t n, const char *kind,
                      const char *where, kvr_errlist *errs)
{
    l->r = calloc(n ? n : 1, sizeof(*l->r));
    if (!l->r)
        abort();
    for (size_t i = 0; i < n; i++) {
        rule r = {0};
        int bad = 0;
        const char *s = items[i];
        if (!s || !*s) {
            kvr_errlist_add(errs, "%s%segress.%s: empty entry", where ? where : "",
                            where ? ": " : "", kind);
            continue;
        }
        if (!parse_addr(s, &r, &bad)) {
            if (bad) {
                kvr_errlist_add(errs, "%s%segress.%s: '%s' is not a valid address or CIDR",
                                where ? where : "", where ? ": " : "", kind, s);
                continue;
            }
            r.is_glob = 1;
        }
        if (!(r.text = strdup(s)))
            abort();
        l->r[l->n++] = r;
    }
}

kvr_egress *kvr_egress_new(const char *const *allow, size_t nallow, const char *const *deny,
                           size_t ndeny, const char *where, kvr_errlist *errs)
{
    kvr_egress *e = calloc(1, sizeof(*e));
    if (!e)
        abort();
    add_rules(&e->allow, allow, nallow, "allow", where, errs);
    add_rules(&e->deny, deny, ndeny, "deny", where, errs);
    return e;
}

static void free_list(list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->r[i].text);
    free(l->r);
}

void kvr_egress_free(kvr_egress *e)
{
    if (!e)
        return;
    free_list(&e->allow);
    free_list(&e->deny);
    free(e);
}

int kvr_egress_active(const kvr_egress *e)
{
    return e && (e->allow.n || e->deny.n);
}

static int prefix_match(const uint8_t *a, const uint8_t *b, int bits)
{
    int bytes = bits / 8, rem = bits % 8;
    if (memcmp(a, b, (size_t)bytes) != 0)
        return 0;
    if (!rem)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rem));
    return (a[bytes] & mask) == (b[bytes] & mask);
}

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is judged as the IPv4 address it is. */
static int sockaddr_bytes(const struct sockaddr *sa, uint8_t *out, int *fam)
{
    if (sa->sa_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        *fam = AF_INET;
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(b, mapped, 12) == 0) {
            memcpy(out, b + 12, 4);
            *fam = AF_INET;
        } else {
            memcpy(out, b, 16);
            *fam = AF_INET6;
        }
        return 0;
    }
    return -1;
}

/* The first rule of `l` matching the host name or the address (either may be absent). */
static const rule *match(const list *l, const char *host, const uint8_t *addr, int fam)
{
    for (size_t i = 0; i < l->n; i++) {
        const rule *r = &l->r[i];
        if (r->is_glob ? host && fnmatch(r->text, host, FNM_CASEFOLD) == 0
                       : addr && r->family == fam && prefix_match(addr, r->addr, r->prefix))
            return r;
    }
    return NULL;
}

static int has_addr_rules(const list *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (!l->r[i].is_glob)
            return 1;
    return 0;
}

/* The decision with what is known: `addr` NULL = a name not resolved yet. */
static int decide(const kvr_egress *e, const char *host, const uint8_t *addr, int fam,
                  int resolved, char *why, size_t cap)
{
    if (!kvr_egress_active(e))
        return 1;
    const rule *d = match(&e->deny, host, addr, fam);
    if (d) {
        snprintf(why, cap, "deny %s", d->text);
        return 0;
    }
    if (!e->allow.n || match(&e->allow, host, addr, fam))
        return 1;
    if (!resolved && has_addr_rules(&e->allow))
        return 1; /* judged at connect time, once its addresses are known */
    snprintf(why, cap, "not in the allow list");
    return 0;
}

int kvr_egress_url_host(const char *url, char *out, size_t cap)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    const char *at = NULL;
    for (const char *q = p; *q && *q != '/' && *q != '?' && *q != '#'; q++)
        if (*q == '@')
            at = q;
    if (at)
        p = at + 1;
    const char *end;
    if (*p == '[') {
        p++;
        end = strchr(p, ']');
        if (!end)
            return -1;
    } else {
        end = p + strcspn(p, ":/?#");
    }
    size_t n = (size_t)(end - p);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

int kvr_egress_check_url(const kvr_egress *e, const char *url, char *why, size_t cap)
{
    char host[256];
    if (!kvr_egress_active(e))
        return 1;
    if (kvr_egress_url_host(url, host, sizeof(host)) < 0) {
        snprintf(why, cap, "no host in the URL");
        return 0;
    }
    uint8_t a[16];
    int fam = strchr(host, ':') ? AF_INET6 : AF_INET;
    if (inet_pton(fam, host, a) == 1)
        return decide(e, NULL, a, fam, 1, why, cap);
    return decide(e, host, NULL, 0, 0, why, cap);
}

int kvr_egress_check_addr(const kvr_egress *e, const char *host, const struct sockaddr *sa,
                          char *why, size_t cap)
{
    uint8_t a[16];
    int fam;
    if (!kvr_egress_active(e))
        return 1;
    if (sockaddr_bytes(sa, a, &fam) < 0) {
        snprintf(why, cap, "not an IP address");
        return 0;
    }
    /* A literal host is its address: only the address rules speak for it. */
    uint8_t lit[16];
    int literal = host && (inet_pton(AF_INET, host, lit) == 1 || inet_pton(AF_INET6, host, lit) == 1);
    return decide(e, literal ? NULL : host, a, fam, 1, why, cap);
}
