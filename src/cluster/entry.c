/* Routing-log entries and the Redis URL (cluster/entry.h). */
#include "cluster/entry.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include "util/xxh.h"

uint64_t kvr_entry_key(const kvr_entry *e, size_t i)
{
    const unsigned char *p = e->keys + i * 8;
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}

void kvr_entry_session_digest(const void *id, size_t len, unsigned char out[16])
{
    XXH128_hash_t h = XXH3_128bits(id, len);
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(h.high64 >> (56 - 8 * i));
        out[8 + i] = (unsigned char)(h.low64 >> (56 - 8 * i));
    }
}

static int is(const char *f, size_t n, const char *name)
{
    return strlen(name) == n && memcmp(f, name, n) == 0;
}

/* A decimal of 1..19 digits (no sign, no blanks) into *v. */
static int decimal(const char *p, size_t n, uint64_t *v)
{
    if (!n || n > 19)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        x = x * 10 + (uint64_t)(p[i] - '0');
    }
    *v = x;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int name_ok(size_t n)
{
    return n >= 1 && n <= KVR_ENTRY_MAX_NAME;
}

int kvr_entry_decode(const char *const *f, const size_t *flen, size_t n, kvr_entry *out)
{
    memset(out, 0, sizeof(*out));
    if (n % 2)
        return -1;
    const char *ver = NULL, *type = NULL;
    size_t verlen = 0, typelen = 0;
    int have_ts = 0;
    for (size_t i = 0; i < n; i += 2) {
        const char *k = f[i], *v = f[i + 1];
        size_t kl = flen[i], vl = flen[i + 1];
        if (!k || !v)
            return -1;
        if (is(k, kl, "v")) {
            ver = v;
            verlen = vl;
        } else if (is(k, kl, "t")) {
            type = v;
            typelen = vl;
        } else if (is(k, kl, "r")) {
            out->replica = v;
            out->replica_len = vl;
        } else if (is(k, kl, "m")) {
            out->route = v;
            out->route_len = vl;
        } else if (is(k, kl, "w")) {
            out->worker = v;
            out->worker_len = vl;
        } else if (is(k, kl, "ts")) {
            if (decimal(v, vl, &out->ts_ms) < 0)
                return -1;
            have_ts = 1;
        } else if (is(k, kl, "bb")) {
            uint64_t bb;
            if (decimal(v, vl, &bb) < 0 || bb == 0 || bb > (1u << 30))
                return -1;
            out->block_bytes = (size_t)bb;
        } else if (is(k, kl, "b")) {
            if (vl % 8 || vl / 8 > KVR_ENTRY_MAX_KEYS)
                return -1;
            out->keys = (const unsigned char *)v;
            out->nkeys = vl / 8;
        } else if (is(k, kl, "ttl")) {
            /* at most the --session-ttl bound (1e9 s): ms then fit any clock arithmetic */
            if (decimal(v, vl, &out->ttl_s) < 0 || out->ttl_s > 1000000000u)
                return -1;
        } else if (is(k, kl, "keep")) {
            if (decimal(v, vl, &out->keep_blocks) < 0 || out->keep_blocks > (1u << 30))
                return -1;
        } else if (is(k, kl, "s")) {
            if (vl != 32)
                return -1;
            for (size_t j = 0; j < 16; j++) {
                int hi = hexval((unsigned char)v[2 * j]), lo = hexval((unsigned char)v[2 * j + 1]);
                if (hi < 0 || lo < 0)
                    return -1;
                out->session[j] = (unsigned char)(hi << 4 | lo);
            }
            out->has_session = 1;
        }
    }
    if (!ver)
        return -1;
    uint64_t vnum;
    if (decimal(ver, verlen, &vnum) < 0)
        return -1;
    if (vnum != KVR_ENTRY_VERSION)
        return 1;
    if (!type)
        return -1;
    if (is(type, typelen, "teach"))
        out->type = KVR_ENTRY_TEACH;
    else if (is(type, typelen, "forget"))
        out->type = KVR_ENTRY_FORGET;
    else if (is(type, typelen, "correct"))
        out->type = KVR_ENTRY_CORRECT;
    else
        return 1;
    if (!name_ok(out->replica_len) || !name_ok(out->worker_len) || !have_ts)
        return -1;
    if (out->type == KVR_ENTRY_FORGET) {
        /* Only the worker counts: whatever else came along is not part of it. */
        out->route = NULL;
        out->route_len = 0;
        out->keys = NULL;
        out->nkeys = 0;
        out->block_bytes = 0;
        out->has_session = 0;
        out->ttl_s = 0;
        out->keep_blocks = 0;
    } else if (out->type == KVR_ENTRY_CORRECT) {
        /* One key, the block found missing; no session. */
        if (!name_ok(out->route_len) || out->nkeys != 1 || !out->block_bytes)
            return -1;
        out->has_session = 0;
        out->ttl_s = 0;
    } else {
        if (!name_ok(out->route_len))
            return -1;
        if (out->nkeys && !out->block_bytes)
            return -1;
        if (!out->has_session)
            out->ttl_s = 0;
        out->keep_blocks = 0;
    }
    return 0;
}

/* ---- frames (in-process queue of encoded entries) ---- */

static int put_str(kvr_buf *b, const void *p, size_t n)
{
    uint32_t l = (uint32_t)n;
    if (kvr_buf_append(b, &l, sizeof(l)) < 0)
        return -1;
    return n ? kvr_buf_append(b, p, n) : 0;
}

static int put_field(kvr_buf *b, const char *name, const void *p, size_t n)
{
    return put_str(b, name, strlen(name)) < 0 || put_str(b, p, n) < 0 ? -1 : 0;
}

int kvr_entry_encode(const kvr_entry *e, size_t max_keys, kvr_buf *out)
{
    int teach = e->type == KVR_ENTRY_TEACH, correct = e->type == KVR_ENTRY_CORRECT;
    if (!name_ok(e->replica_len) || !name_ok(e->worker_len) ||
        ((teach || correct) && !name_ok(e->route_len)) ||
        (correct && (e->nkeys < 1 || !e->block_bytes)))
        return -1;
    size_t start = out->len;
    size_t nkeys = correct ? 1 : e->nkeys < max_keys ? e->nkeys : max_keys;
    if (nkeys > KVR_ENTRY_MAX_KEYS)
        nkeys = KVR_ENTRY_MAX_KEYS;
    if (nkeys && !e->block_bytes)
        nkeys = 0; /* keys without their block size mean nothing */
    char ts[24], bb[24], num[24], sess[32];
    int tl = snprintf(ts, sizeof(ts), "%llu", (unsigned long long)e->ts_ms);
    int bl = snprintf(bb, sizeof(bb), "%zu", e->block_bytes);
    const char *type = teach ? "teach" : correct ? "correct" : "forget";
    int sessioned = teach && e->has_session;
    uint32_t nf = 10;
    if (teach || correct)
        nf += 2 + (nkeys ? 4 : 0);
    if (sessioned)
        nf += 2 + (e->ttl_s ? 2 : 0);
    if (correct)
        nf += 2;
    int rc = kvr_buf_append(out, &nf, sizeof(nf));
    rc |= put_field(out, "v", "1", 1);
    rc |= put_field(out, "t", type, strlen(type));
    rc |= put_field(out, "r", e->replica, e->replica_len);
    rc |= put_field(out, "w", e->worker, e->worker_len);
    rc |= put_field(out, "ts", ts, (size_t)tl);
    if (teach || correct) {
        rc |= put_field(out, "m", e->route, e->route_len);
        if (nkeys) {
            rc |= put_field(out, "bb", bb, (size_t)bl);
            rc |= put_str(out, "b", 1);
            uint32_t l = (uint32_t)(nkeys * 8);
            rc |= kvr_buf_append(out, &l, sizeof(l));
            rc |= kvr_buf_append(out, e->keys, nkeys * 8);
        }
    }
    if (sessioned) {
        static const char hex[] = "0123456789abcdef";
        for (int i = 0; i < 16; i++) {
            sess[2 * i] = hex[e->session[i] >> 4];
            sess[2 * i + 1] = hex[e->session[i] & 15];
        }
        rc |= put_field(out, "s", sess, 32);
        if (e->ttl_s) {
            int n = snprintf(num, sizeof(num), "%llu", (unsigned long long)e->ttl_s);
            rc |= put_field(out, "ttl", num, (size_t)n);
        }
    }
    if (correct) {
        int n = snprintf(num, sizeof(num), "%llu", (unsigned long long)e->keep_blocks);
        rc |= put_field(out, "keep", num, (size_t)n);
    }
    if (rc) {
        out->len = start;
        return -1;
    }
    return 0;
}

size_t kvr_entry_frame_next(const char *buf, size_t len, size_t *off, const char **argv,
                            size_t *lens)
{
    size_t o = *off;
    uint32_t nf;
    if (len - o < sizeof(nf))
        return 0;
    memcpy(&nf, buf + o, sizeof(nf));
    o += sizeof(nf);
    if (nf > KVR_ENTRY_MAX_FIELDS)
        return 0;
    for (uint32_t i = 0; i < nf; i++) {
        uint32_t l;
        if (len - o < sizeof(l))
            return 0;
        memcpy(&l, buf + o, sizeof(l));
        o += sizeof(l);
        if (len - o < l)
            return 0;
        argv[i] = buf + o;
        lens[i] = l;
        o += l;
    }
    *off = o;
    return nf;
}

/* ---- redis:// URLs ---- */

/* Copies [p, p+n) percent-decoded into out (cap bytes, NUL-terminated). */
static int pct_copy(const char *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)p[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = hexval((unsigned char)p[i + 1]), lo = hexval((unsigned char)p[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = hi << 4 | lo;
            i += 2;
        }
        if (c == 0 || o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

int kvr_redis_url_parse(const char *url, kvr_redis_url *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    out->port = 6379;
    if (!url) {
        snprintf(err, cap, "no URL");
        return -1;
    }
    if (!strncmp(url, "rediss://", 9)) {
        snprintf(err, cap, "rediss:// needs TLS, which this build's hiredis (0.14, Debian 12) "
                           "does not have: use redis:// (through a TLS tunnel if needed)");
        return -1;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        snprintf(err, cap, "'%.100s' is not a redis:// URL (redis://[user:pass@]host:port/db)",
                 url);
        return -1;
    }
    const char *p = url + 8;
    for (const char *q = p; *q; q++)
        if ((unsigned char)*q <= ' ' || *q == 0x7f) {
            snprintf(err, cap, "blank or control byte in the URL");
            return -1;
        }
    size_t auth_end = strcspn(p, "@/");
    if (p[auth_end] == '@') {
        size_t colon = strcspn(p, ":@");
        if (p[colon] == ':') {
            if (pct_copy(p, colon, out->user, sizeof(out->user)) < 0 ||
                pct_copy(p + colon + 1, auth_end - colon - 1, out->password,
                         sizeof(out->password)) < 0) {
                snprintf(err, cap, "bad user or password in the URL");
                return -1;
            }
        } else if (pct_copy(p, auth_end, out->password, sizeof(out->password)) < 0) {
            snprintf(err, cap, "bad password in the URL");
            return -1;
        }
        p += auth_end + 1;
    }
    size_t hl;
    const char *h = p;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close) {
            snprintf(err, cap, "unclosed '[' in the URL's host");
            return -1;
        }
        h = p + 1;
        hl = (size_t)(close - h);
        p = close + 1;
    } else {
        hl = strcspn(p, ":/");
        p += hl;
    }
    if (!hl || hl >= sizeof(out->host)) {
        snprintf(err, cap, "empty or oversized host in the URL");
        return -1;
    }
    memcpy(out->host, h, hl);
    out->host[hl] = '\0';
    if (*p == ':') {
        p++;
        size_t n = strcspn(p, "/");
        uint64_t port;
        if (decimal(p, n, &port) < 0 || port < 1 || port > 65535) {
            snprintf(err, cap, "bad port in the URL (1..65535)");
            return -1;
        }
        out->port = (int)port;
        p += n;
    }
    if (*p == '/') {
        p++;
        if (*p) {
            uint64_t db;
            if (decimal(p, strlen(p), &db) < 0 || db > 65535) {
                snprintf(err, cap, "bad database number in the URL (0..65535)");
                return -1;
            }
            out->db = (int)db;
        }
    } else if (*p) {
        snprintf(err, cap, "unexpected '%c' in the URL", *p);
        return -1;
    }
    return 0;
}
