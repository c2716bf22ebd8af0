/* Request validation that http_parser (Debian's non-strict 2.9.4 build) does not do: a raw
 * pre-scan of the header block (byte and line limits, obs-fold, bare CR) and the request-level
 * rules checked once the headers are complete (version, method, target form, Host,
 * Transfer-Encoding, Content-Length limit, Expect). The rules are table B.1 of the shared
 * reference, after RFC 9112 (framing) and RFC 9110 (fields). */
#include <string.h>
#include <strings.h>

#include "http/internal.h"


/* RFC 9110 5.6.2 tchar: "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_"
 * / "`" / "|" / "~" / DIGIT / ALPHA. */
static const unsigned char g_tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

static inline int is_tchar(unsigned char ch)
{
    return g_tchar[ch]; /* a table: every header name of every request passes here */
}

int kvr_http_is_token(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)p[i]))
            return 0;
    return 1;
}

int kvr_http__method_allowed(unsigned m)
{
    switch (m) {
    case HTTP_GET:
    case HTTP_HEAD:
    case HTTP_POST:
    case HTTP_PUT:
    case HTTP_DELETE:
    case HTTP_OPTIONS:
    case HTTP_PATCH:
        return 1;
    default:
        return 0;
    }
}

static int scan_fail(kvr_http_conn *c, int status, const char *msg)
{
    c->err_msg = msg;
    return status;
}

/* The scan mirrors where http_parser puts line and block boundaries: empty lines before the
 * request line are skipped, LF or CRLF ends a line (bare LF is accepted, as http_parser does;
 * RFC 9112 2.2 allows it), an empty line ends the block. It runs only until that empty line, so
 * body bytes are never scanned. Work per line is two memchr() calls. */
int kvr_http__scan(kvr_http_conn *c, const char *p, size_t n)
{
    const size_t max_bytes = c->srv->lim.max_header_bytes;
    const size_t max_lines = c->srv->lim.max_headers;
    const char *s = p, *e = p + n;

    while (s < e) {
        switch (c->scan_state) {
        case KVR_HTTP_SCAN_PRE:
            if (*s == '\r' || *s == '\n') {
                s++;
                break;
            }
            c->scan_state = KVR_HTTP_SCAN_LINE;
            c->scan_first = 1;
            break;
        case KVR_HTTP_SCAN_LINE: {
            const char *lf = memchr(s, '\n', (size_t)(e - s));
            const char *end = lf ? lf : e;
            size_t len = (size_t)(end - s) + (lf ? 1 : 0);
            if (c->scan_bytes + len > max_bytes)
                return c->scan_first
                           ? scan_fail(c, 414, "request line exceeds the header size limit")
                           : scan_fail(c, 431, "request headers exceed the size limit");
            c->scan_bytes += len;
            /* A CR is only allowed right before LF (or as the last byte so far). */
            if (end > s) {
                const char *cr = memchr(s, '\r', (size_t)(end - s));
                if (cr && cr != end - 1)
                    return scan_fail(c, 400, "bare CR in the request header block");
                if (!lf && cr) {
                    c->scan_state = KVR_HTTP_SCAN_CR;
                    s = e;
                    break;
                }
            }
            if (lf) {
                c->scan_state = KVR_HTTP_SCAN_BOL;
                c->scan_first = 0;
            }
            s = lf ? lf + 1 : e;
            break;
        }
        case KVR_HTTP_SCAN_CR:
            /* The previous slice ended with CR: this byte must be LF. */
            if (*s != '\n')
                return scan_fail(c, 400, "bare CR in the request header block");
            if (++c->scan_bytes > max_bytes)
                return scan_fail(c, c->scan_first ? 414 : 431,
                                 "request headers exceed the size limit");
            c->scan_state = KVR_HTTP_SCAN_BOL;
            c->scan_first = 0;
            s++;
            break;
        case KVR_HTTP_SCAN_BOL:
            if (++c->scan_bytes > max_bytes)
                return scan_fail(c, 431, "request headers exceed the size limit");
            if (*s == '\n') {
                c->scan_state = KVR_HTTP_SCAN_DONE;
                return 0;
            }
            if (*s == '\r') {
                c->scan_state = KVR_HTTP_SCAN_END_CR;
                s++;
                break;
            }
            if (*s == ' ' || *s == '\t')
                return scan_fail(c, 400, "obsolete header line folding is not accepted");
            if (++c->scan_lines > max_lines)
                return scan_fail(c, 431, "too many request header lines");
            c->scan_state = KVR_HTTP_SCAN_LINE;
            c->scan_bytes--; /* KVR_HTTP_SCAN_LINE counts this byte again */
            break;
        case KVR_HTTP_SCAN_END_CR:
            if (*s != '\n')
                return scan_fail(c, 400, "bare CR in the request header block");
            if (++c->scan_bytes > max_bytes)
                return scan_fail(c, 431, "request headers exceed the size limit");
            c->scan_state = KVR_HTTP_SCAN_DONE;
            return 0;
        default: /* KVR_HTTP_SCAN_DONE */
            return 0;
        }
    }
    return 0;
}

static int ieq(const char *a, size_t alen, const char *lit)
{
    size_t n = strlen(lit);
    return alen == n && strncasecmp(a, lit, n) == 0;
}

/* RFC 9112 6.1/6.3: chunked must be the final coding (else the length is unknowable: 400);
 * any other coding is one we do not implement (501). Empty list elements are ignored
 * (RFC 9110 5.6.1). */
static int check_te(const char *v, const char **msg)
{
    size_t ncodings = 0;
    const char *last = NULL;
    size_t last_len = 0;
    const char *s = v;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        if (!*s)
            break;
        const char *b = s;
        while (*s && *s != ',')
            s++;
        const char *e = s;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        ncodings++;
        last = b;
        last_len = (size_t)(e - b);
    }
    if (!last || !ieq(last, last_len, "chunked")) {
        *msg = "Transfer-Encoding must end with chunked";
        return 400;
    }
    if (ncodings > 1) {
        *msg = "only the chunked transfer coding is implemented";
        return 501;
    }
    return 0;
}

static int check_target(const kvr_http_req *r)
{
    const unsigned char *t = (const unsigned char *)r->hbuf.data;
    if (r->target_len == 0 || t[0] != '/')
        return -1;
    for (uint32_t i = 0; i < r->target_len; i++)
        if (t[i] <= 0x20 || t[i] == 0x7f || t[i] == '#')
            return -1;
    return 0;
}

int kvr_http__validate(kvr_http_conn *c, const char **msg)
{
    const http_parser *hp = &c->parser;
    kvr_http_req *r = &c->req;

    if (hp->http_major != 1 || hp->http_minor > 1) {
        *msg = "only HTTP/1.0 and HTTP/1.1 are supported";
        return 505;
    }
    if (!kvr_http__method_allowed(hp->method)) {
        *msg = "method not implemented";
        return 501;
    }
    /* Origin-form only (RFC 9112 3.2.1): an absolute-form target turned into an upstream URL
     * is how a proxy becomes an open relay (reference B.5.9). */
    if (check_target(r) < 0) {
        *msg = "the request target must be an origin-form path";
        return 400;
    }

    size_t nhost = 0, nte = 0, nexpect = 0;
    const char *te = NULL, *expect = NULL;
    int coded = 0;
    for (size_t i = 0; i < r->nhdrs; i++) {
        const kvr_http_header *h = &r->hdrs[i];
        switch (h->name_len) {
        case 4:
            if (ieq(h->name, 4, "host"))
                nhost++;
            break;
        case 6:
            if (ieq(h->name, 6, "expect")) {
                nexpect++;
                expect = h->value;
            }
            break;
        case 16:
            /* RFC 9110 8.4: a body coding kvroute cannot read (it reads bodies to route them,
             * and workers take JSON as is); "identity" is no coding. */
            if (ieq(h->name, 16, "content-encoding") && h->value_len &&
                !(h->value_len == 8 && ieq(h->value, 8, "identity")))
                coded = 1;
            break;
        case 17:
            if (ieq(h->name, 17, "transfer-encoding")) {
                nte++;
                te = h->value;
            }
            break;
        default:
            break;
        }
    }
    /* RFC 9112 3.2: exactly one Host in HTTP/1.1; never two. */
    if (nhost > 1 || (hp->http_minor == 1 && nhost == 0)) {
        *msg = nhost ? "more than one Host header" : "missing Host header";
        return 400;
    }
    if (nte) {
        /* RFC 9112 6.1: a 1.0 message with Transfer-Encoding is faulty framing. */
        if (hp->http_minor == 0) {
            *msg = "Transfer-Encoding is not allowed in HTTP/1.0";
            return 400;
        }
        if (nte > 1) {
            *msg = "more than one Transfer-Encoding header";
            return 400;
        }
        if (hp->flags & F_CONTENTLENGTH) {
            *msg = "both Content-Length and Transfer-Encoding";
            return 400;
        }
        int st = check_te(te, msg);
        if (st)
            return st;
    }
    if (coded) {
        /* RFC 9110 15.5.16: 415 for a content coding the server does not accept */
        *msg = "Content-Encoding is not supported: send the request body uncompressed";
        return 415;
    }
    if ((hp->flags & F_CONTENTLENGTH) && hp->content_length > c->srv->lim.max_body_bytes) {
        *msg = "request body is larger than the limit";
        return 413;
    }
    c->expect_continue = 0;
    if (nexpect && hp->http_minor == 1) {
        /* RFC 9110 10.1.1: 100-continue is the only expectation; a 1.0 client's is ignored. */
        if (nexpect > 1 || strcasecmp(expect, "100-continue") != 0) {
            *msg = "unsupported expectation";
            return 417;
        }
        c->expect_continue = 1;
    }
    return 0;
}
