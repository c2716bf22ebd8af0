/* Client API keys (see auth.h). */
#include "api/auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct entry {
    char *name;
    char *key;
    size_t len;
} entry;

struct kvr_auth {
    entry *e;
    size_t n;
};

void kvr_auth_free(kvr_auth *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++) {
        free(a->e[i].name);
        /* Keys do not linger in freed memory. */
        memset(a->e[i].key, 0, a->e[i].len);
        free(a->e[i].key);
    }
    free(a->e);
    free(a);
}

static char *trim(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

kvr_auth *kvr_auth_load(const char *path, kvr_errlist *errs)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kvr_errlist_add(errs, "api key file %s: cannot read it", path);
        return NULL;
    }
    kvr_auth *a = calloc(1, sizeof(*a));
    char line[4096];
    int lineno = 0, ok = a != NULL;
    while (ok && fgets(line, sizeof(line), f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *colon = strchr(s, ':'), name[64];
        const char *key = s;
        if (colon) {
            *colon = '\0';
            snprintf(name, sizeof(name), "%s", trim(s));
            key = trim(colon + 1);
        } else {
            snprintf(name, sizeof(name), "key-%d", lineno);
        }
        if (!*key || !*name) {
            kvr_errlist_add(errs, "api key file %s:%d: empty name or key", path, lineno);
            continue;
        }
        entry *ne = realloc(a->e, (a->n + 1) * sizeof(*ne));
        ok = ne != NULL;
        if (!ok)
            break;
        a->e = ne;
        entry *en = &a->e[a->n];
        en->name = strdup(name);
        en->key = strdup(key);
        en->len = strlen(key);
        ok = en->name && en->key;
        a->n += ok;
    }
    fclose(f);
    if (!ok || a->n == 0) {
        kvr_errlist_add(errs, "api key file %s: %s", path, ok ? "holds no key" : "out of memory");
        kvr_auth_free(a);
        return NULL;
    }
    return a;
}

const char *kvr_auth_reason(kvr_auth_result r)
{
    return r == KVR_AUTH_MISSING ? "missing" : "invalid";
}

/* Compares every byte of both, whatever the first difference. */
static int same(const char *a, size_t al, const char *b, size_t bl)
{
    unsigned char diff = (unsigned char)(al != bl);
    for (size_t i = 0; i < bl; i++)
        diff |= (unsigned char)(b[i] ^ (i < al ? a[i] : 0));
    return diff == 0;
}

kvr_auth_result kvr_auth_check(const kvr_auth *a, kvr_http_req *r, const char **name)
{
    const char *h = kvr_http_req_header(r, "authorization"), *k = NULL;
    if (h && strncasecmp(h, "Bearer ", 7) == 0)
        k = h + 7;
    else if ((h = kvr_http_req_header(r, "x-api-key")))
        k = h;
    if (!k || !*k)
        return KVR_AUTH_MISSING;
    size_t kl = strlen(k);
    const entry *hit = NULL;
    /* Every key is compared, so the time says nothing about which one matched. */
    for (size_t i = 0; i < a->n; i++)
        if (same(k, kl, a->e[i].key, a->e[i].len) && !hit)
            hit = &a->e[i];
    if (!hit)
        return KVR_AUTH_INVALID;
    *name = hit->name;
    return KVR_AUTH_OK;
}
