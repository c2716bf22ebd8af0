/* Hop-by-hop header filtering. */
#include "proxy/headers.h"

#include <string.h>
#include <strings.h>

int kvr_header_is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && strncasecmp(name, want, len) == 0;
}

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
    static const char *const hop[] = {"connection", "keep-alive", "proxy-authenticate",
                                      "proxy-authorization", "proxy-connection", "te",
                                      "trailer", "transfer-encoding", "upgrade"};
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (kvr_header_is(name, len, hop[i]))
            return 1;
    return connection && listed_in(name, len, connection);
}
