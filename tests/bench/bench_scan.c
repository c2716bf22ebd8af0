/* Micro-benchmark of reading a request body (issue 18; `make bench-scan`, never a test):
 * bytes/s of the validating scanner (util/json_scan.h) as the proxy runs it
 * (kvr_body_fields_scan + kvr_api_validate_fields), of the bare scan, and of the tree it
 * replaces (kvr_json_read + kvr_api_validate + json_decref; jansson's json_loadb for
 * reference), on three chat bodies: 8 KB and 64 KB single-turn ones shaped like
 * bench/overhead.sh's, and the largest tau-bench airline conversation (data/, a real
 * multi-turn agent body with tool calls) as one request.
 *
 * Usage: bench-scan [TRAJECTORIES.jsonl] [SECONDS per cell, default 0.3]. Prints a Markdown
 * table; each figure is the best of 5 timed runs (the machine is shared: the best run is
 * the least disturbed one). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/validate.h"
#include "routing/fields.h"
#include "util/json_read.h"
#include "util/json_scan.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A chat request of exactly `size` bytes (bench/overhead.sh's make_body). */
static char *chat_body(size_t size)
{
    static const char pre[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You "
                              "are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"";
    static const char post[] = "\"}],\"max_tokens\":16,\"temperature\":0}";
    static const char text[] = "Explain how a prefix cache lets an inference server reuse the "
                               "KV cache blocks. ";
    char *b = malloc(size + 1);
    if (!b)
        abort();
    size_t n = 0, pad = size - (sizeof(pre) - 1) - (sizeof(post) - 1);
    memcpy(b, pre, sizeof(pre) - 1);
    n = sizeof(pre) - 1;
    for (size_t i = 0; i < pad; i++)
        b[n++] = text[i % (sizeof(text) - 1)];
    memcpy(b + n, post, sizeof(post));
    return b;
}

/* The longest conversation of a tau-bench trajectories file as one chat request. */
static char *tau_body(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *line = NULL, *best = NULL;
    size_t cap = 0, bestlen = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)n, 0, NULL);
        json_t *req = j ? json_pack("{s:s,s:O,s:i,s:b}", "model", "m", "messages",
                                    json_object_get(j, "messages"), "max_tokens", 256,
                                    "stream", 1)
                        : NULL;
        char *s = req ? json_dumps(req, JSON_COMPACT) : NULL;
        if (s && strlen(s) > bestlen) {
            free(best);
            best = s;
            bestlen = strlen(s);
        } else {
            free(s);
        }
        json_decref(req);
        json_decref(j);
    }
    free(line);
    fclose(f);
    return best;
}

typedef enum { SCAN_FIELDS, SCAN_BARE, TREE_READ, TREE_JANSSON, TEXT_SCAN, TEXT_TREE } what;

static volatile size_t g_sink;
static kvr_session_sources g_src; /* parsed once, as the proxy has it (app->session_sources) */

/* The routing text of a chat body from its tree (what cache_aware reads). */
static void text_of(const json_t *j)
{
    kvr_buf t;
    kvr_buf_init(&t, 32u << 20);
    if (kvr_route_text_build(j, KVR_ROUTE_CHAT, &t) < 0)
        abort();
    g_sink += t.len;
    kvr_buf_free(&t);
}

static void once(what w, const char *b, size_t len)
{
    char msg[300];
    const char *param;
    switch (w) {
    case SCAN_FIELDS: {
        static kvr_body_fields f;
        if (kvr_body_fields_scan(&f, b, len, &g_src) < 0 ||
            kvr_api_validate_fields(&f, KVR_EP_CHAT, msg, sizeof(msg), &param) != 0)
            abort();
        g_sink += f.v[KVR_FIELD_MODEL].len;
        break;
    }
    case SCAN_BARE:
        if (kvr_json_scan(b, len, NULL, 0, NULL) < 0)
            abort();
        break;
    case TREE_READ: {
        json_t *j = kvr_json_read(b, len, NULL);
        if (!j || kvr_api_validate(j, KVR_EP_CHAT, msg, sizeof(msg), &param) != 0)
            abort();
        json_decref(j);
        break;
    }
    case TEXT_SCAN: { /* a text policy among routes that do not all read it */
        static kvr_body_fields f;
        if (kvr_body_fields_scan(&f, b, len, &g_src) < 0 ||
            kvr_api_validate_fields(&f, KVR_EP_CHAT, msg, sizeof(msg), &param) != 0)
            abort();
        json_t *j = kvr_json_read(b, len, NULL);
        if (!j)
            abort();
        text_of(j);
        json_decref(j);
        break;
    }
    case TEXT_TREE: { /* every route reads the text: the tree at once (and before) */
        json_t *j = kvr_json_read(b, len, NULL);
        if (!j || kvr_api_validate(j, KVR_EP_CHAT, msg, sizeof(msg), &param) != 0)
            abort();
        text_of(j);
        json_decref(j);
        break;
    }
    case TREE_JANSSON: {
        json_t *j = json_loadb(b, len, 0, NULL);
        if (!j)
            abort();
        json_decref(j);
        break;
    }
    }
}

/* Best of 5 runs of ~`secs`/5 each: seconds per call. */
static double per_call(what w, const char *b, size_t len, double secs)
{
    size_t iters = 1;
    for (;;) { /* calibrate */
        double t0 = now_s();
        for (size_t i = 0; i < iters; i++)
            once(w, b, len);
        double dt = now_s() - t0;
        if (dt > secs / 20)
            break;
        iters *= 2;
    }
    iters = iters * 4; /* ~secs/5 per run */
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        for (size_t i = 0; i < iters; i++)
            once(w, b, len);
        double dt = (now_s() - t0) / (double)iters;
        if (dt < best)
            best = dt;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *tau = argc > 1 ? argv[1] : "data/tau-bench-airline-gpt4o/trajectories.jsonl";
    double secs = argc > 2 ? atof(argv[2]) : 0.3;
    kvr_session_sources_default(&g_src);
    struct {
        const char *name;
        char *body;
    } bodies[] = {
        {"8 KB chat", chat_body(8192)},
        {"64 KB chat", chat_body(65536)},
        {"tau-bench airline, longest conversation", tau_body(tau)},
    };
    static const struct {
        what w;
        const char *name;
    } cells[] = {
        {SCAN_FIELDS, "scan: kvr_body_fields_scan + kvr_api_validate_fields (the proxy's path)"},
        {SCAN_BARE, "scan: kvr_json_scan alone (validation only)"},
        {TREE_READ, "tree: kvr_json_read + kvr_api_validate + json_decref (before)"},
        {TREE_JANSSON, "tree: jansson json_loadb + json_decref (reference)"},
        {TEXT_TREE, "routing text, every route reads it: tree + validate + text (as before)"},
        {TEXT_SCAN, "routing text, mixed routes: scan + validate + tree + text"},
    };
    printf("| body | bytes | what | µs per body | MB/s (10^6 bytes/s) |\n");
    printf("|---|---:|---|---:|---:|\n");
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        if (!bodies[i].body) {
            fprintf(stderr, "bench-scan: cannot read %s\n", tau);
            continue;
        }
        size_t len = strlen(bodies[i].body);
        for (size_t c = 0; c < sizeof(cells) / sizeof(cells[0]); c++) {
            double t = per_call(cells[c].w, bodies[i].body, len, secs);
            printf("| %s | %zu | %s | %.2f | %.0f |\n", bodies[i].name, len, cells[c].name,
                   t * 1e6, (double)len / t / 1e6);
            fflush(stdout);
        }
        free(bodies[i].body);
    }
    return 0;
}
