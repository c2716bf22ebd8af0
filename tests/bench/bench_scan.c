/* Micro-benchmark of reading a request body (issue 18; `make bench-scan`, never a test):
 * bytes/s of the validating scanner (util/json_scan.h) as the proxy runs it
 * (kvr_body_fields_scan + kvr_api_validate_fields), of the bare scan, and of the tree it
 * replaces (kvr_json_read + kvr_api_validate + json_decref; jansson's json_loadb for
 * reference), and of the routing text (from the tree as before, from the scan as now, with
 * the tools cache hitting and missing), on chat bodies: 8 KB and 64 KB single-turn ones
 * shaped like bench/overhead.sh's, the largest tau-bench airline conversation (data/, a
 * real multi-turn agent body with tool calls) as one request, and that body with a 12-tool
 * list (text cells only).
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
#include "routing/text_scan.h"
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

/* `body` with a tools list added: 12 function tools with JSON-schema parameters, the size
 * of an agent's toolset (~7 KB). */
static char *with_tools(const char *body)
{
    json_t *j = json_loads(body, 0, NULL), *tools = json_array();
    for (int i = 0; j && i < 12; i++) {
        char name[32];
        snprintf(name, sizeof(name), "tool_%02d", i);
        json_array_append_new(
            tools, json_pack("{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:i},s:{s:s,s:[s,s,s]},"
                             "s:{s:s,s:{s:s}}},s:[s,s]}}}",
                             "type", "function", "function", "name", name, "description",
                             "Look up or change one part of a reservation: the agent calls it "
                             "after confirming the details with the user, never before.",
                             "parameters", "type", "object", "properties", "reservation_id",
                             "type", "string", "description", "The reservation id, e.g. 8JX2WO.",
                             "count", "type", "integer", "minimum", 0, "cabin", "type",
                             "string", "enum", "basic_economy", "economy", "business",
                             "passengers", "type", "array", "items", "type", "object",
                             "required", "reservation_id", "cabin"));
    }
    char *s = NULL;
    if (j && json_object_set_new(j, "tools", tools) == 0)
        s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

typedef enum {
    SCAN_FIELDS,
    SCAN_BARE,
    TREE_READ,
    TREE_JANSSON,
    TEXT_SCAN_TREE,
    TEXT_TREE,
    TEXT_SCAN,
    TEXT_SCAN_MISS,
    TEXT_SCAN_MEMO,
    TEXT_ALONE_SCAN,
    TEXT_ALONE_TREE
} what;

static volatile size_t g_sink;
static kvr_text_cache *g_cache; /* the proxy's app->text_cache, tools sections only */
static kvr_text_cache *g_memo;  /* the same keeping message texts (--routing-text-cache-bytes) */
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
    case TEXT_SCAN:      /* the proxy's path now: no tree */
    case TEXT_SCAN_MISS: /* the same with a tools section built every time */
    case TEXT_SCAN_MEMO: /* the same with every message's text kept from the run before */
    case TEXT_ALONE_SCAN: {
        static kvr_body_fields f;
        if (kvr_body_fields_scan(&f, b, len, &g_src) < 0 ||
            (w != TEXT_ALONE_SCAN &&
             kvr_api_validate_fields(&f, KVR_EP_CHAT, msg, sizeof(msg), &param) != 0))
            abort();
        kvr_buf t;
        kvr_buf_init(&t, 32u << 20);
        size_t nm;
        const kvr_json_elem *ms = kvr_body_messages(&f, &nm);
        if (kvr_route_text_scan(b, kvr_body_field(&f, KVR_FIELD_TOOLS),
                                kvr_body_field(&f, KVR_FIELD_FUNCTIONS),
                                kvr_body_field(&f, KVR_FIELD_MESSAGES), ms, nm,
                                w == TEXT_SCAN_MISS   ? NULL
                                : w == TEXT_SCAN_MEMO ? g_memo
                                                      : g_cache,
                                &t) < 0)
            abort();
        g_sink += t.len;
        kvr_buf_free(&t);
        break;
    }
    case TEXT_ALONE_TREE: { /* the text from a tree already read (the tree's share) */
        static json_t *j;
        static const char *jb;
        if (jb != b) {
            json_decref(j);
            j = kvr_json_read(b, len, NULL);
            jb = b;
        }
        text_of(j);
        break;
    }
    case TEXT_SCAN_TREE: { /* a text policy among routes that do not all read it (before) */
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
    g_cache = kvr_text_cache_new(0, 0);
    g_memo = kvr_text_cache_new(64u << 20, KVR_TEXT_MEMO_MIN);
    char *tb = tau_body(tau);
    struct {
        const char *name;
        char *body;
        int text_only; /* only the routing-text cells */
    } bodies[] = {
        {"8 KB chat", chat_body(8192), 0},
        {"64 KB chat", chat_body(65536), 0},
        {"tau-bench airline, longest conversation", tb, 0},
        {"the same + 12 tools", tb ? with_tools(tb) : NULL, 1},
    };
    static const struct {
        what w;
        int text; /* a routing-text cell */
        const char *name;
    } cells[] = {
        {SCAN_FIELDS, 0, "scan: kvr_body_fields_scan + kvr_api_validate_fields (the proxy's path)"},
        {SCAN_BARE, 0, "scan: kvr_json_scan alone (validation only)"},
        {TREE_READ, 0, "tree: kvr_json_read + kvr_api_validate + json_decref (before)"},
        {TREE_JANSSON, 0, "tree: jansson json_loadb + json_decref (reference)"},
        {TEXT_TREE, 1, "routing text, every route reads it: tree + validate + text (before)"},
        {TEXT_SCAN_TREE, 1, "routing text, mixed routes: scan + validate + tree + text (before)"},
        {TEXT_SCAN, 1, "routing text from the scan: scan + validate + kvr_route_text_scan "
                       "(now; tools cache hit)"},
        {TEXT_SCAN_MISS, 1, "the same, tools cache miss (tools section built every time)"},
        {TEXT_SCAN_MEMO, 1, "the same, tools cache hit and every message's text kept "
                            "(--routing-text-cache-bytes: a later turn resending them)"},
        {TEXT_ALONE_TREE, 1, "text alone: kvr_route_text_build on a tree already read"},
        {TEXT_ALONE_SCAN, 1, "text alone: kvr_body_fields_scan + kvr_route_text_scan"},
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
            if (bodies[i].text_only && !cells[c].text)
                continue;
            double t = per_call(cells[c].w, bodies[i].body, len, secs);
            printf("| %s | %zu | %s | %.2f | %.0f |\n", bodies[i].name, len, cells[c].name,
                   t * 1e6, (double)len / t / 1e6);
            fflush(stdout);
        }
    }
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        free(bodies[i].body);
    kvr_text_cache_free(g_cache);
    kvr_text_cache_free(g_memo);
    return 0;
}
