/* Hop-by-hop header filtering. */
#include "proxy/headers.h"

#include <stdio.h>

#include <string.h>
#include <strings.h>

static int listed_in(const char *name, size_t len, const char *list)
{
    /* Connection: a comma-separated list of tokens with optional whitespace. */
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *s = p;
        while (*p && *p != ',' && *p != ' ' && *p != '\t')
            p++;
        if ((size_t)(p - s) == len && strncasecmp(s, name, len) == 0)
            return 1;
    }
    return 0;
}

int kvr_hop_by_hop(const char *name, size_t len, const char *connection)
{
    /* RFC 9110 7.6.1 and RFC 9112 (keep-alive, proxy-connection: de-facto); by length first,
     * as every response header passes here. */
    const char *want = NULL;
    switch (len) {
    case 2: want = "te"; break;
    case 7: want = (name[0] | 0x20) == 't' ? "trailer" : "upgrade"; break;
    case 10: want = (name[0] | 0x20) == 'c' ? "connection" : "keep-alive"; break;
    case 16: want = "proxy-connection"; break;
    case 17: want = "transfer-encoding"; break;
    case 18: want = "proxy-authenticate"; break;
    case 19: want = "proxy-authorization"; break;
    }
    if (want && strncasecmp(name, want, len) == 0)
        return 1;
    return connection && listed_in(name, len, connection);
}

int kvr_worker_authorization(const kvr_worker *w, char *buf, size_t cap, kvr_http_header *out)
{
    if (!w->api_key)
        return 0;
    int n = snprintf(buf, cap, "Bearer %s", w->api_key);
    if (n <= 0 || (size_t)n >= cap)
        return 0;
    *out = (kvr_http_header){"Authorization", 13, buf, (size_t)n};
    return 1;
}

int kvr_worker_rank_header(const kvr_worker *w, char buf[KVR_RANK_HEADER_BUF],
                           kvr_http_header *out)
{
    if (w->dp_rank < 0)
        return 0;
    int n = snprintf(buf, KVR_RANK_HEADER_BUF, "%d", w->dp_rank);
    *out = (kvr_http_header){"X-data-parallel-rank", 20, buf, (size_t)n};
    return 1;
}
