/* Trace model shared by the loaders, file reading and request bodies. */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "synth.h"

static const struct {
    const char *name;
    const char *file; /* the dataset folder's usual file */
} formats[] = {
    [KVR_BENCH_FMT_TAU] = {"tau", "trajectories.jsonl"},
    [KVR_BENCH_FMT_SWEAGENT] = {"sweagent", "trajectories.jsonl"},
    [KVR_BENCH_FMT_SHAREGPT] = {"sharegpt", "conversations.jsonl"},
    [KVR_BENCH_FMT_MTBENCH] = {"mtbench", "question.jsonl"},
    [KVR_BENCH_FMT_MOONCAKE] = {"mooncake", "conversation_trace.jsonl"},
    [KVR_BENCH_FMT_AZURE] = {"azure", "AzureLLMInferenceTrace_conv.csv"},
};

int kvr_bench_format_parse(const char *s, kvr_bench_format *out)
{
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
        if (strcmp(s, formats[i].name) == 0) {
            *out = (kvr_bench_format)i;
            return 0;
        }
    return -1;
}

const char *kvr_bench_format_name(kvr_bench_format f)
{
    return (size_t)f < sizeof(formats) / sizeof(formats[0]) ? formats[f].name : "?";
}

bool kvr_bench_format_is_conversation(kvr_bench_format f)
{
    return f == KVR_BENCH_FMT_TAU || f == KVR_BENCH_FMT_SWEAGENT || f == KVR_BENCH_FMT_SHAREGPT ||
           f == KVR_BENCH_FMT_MTBENCH;
}

kvr_bench_session *kvr_bench_trace_add_session(kvr_bench_trace *t, const char *name)
{
    if (t->nsessions == t->sessions_cap) {
        size_t nc = t->sessions_cap ? t->sessions_cap * 2 : 64;
        kvr_bench_session *ns = realloc(t->sessions, nc * sizeof(*ns));
        if (!ns)
            return NULL;
        t->sessions = ns;
        t->sessions_cap = nc;
    }
    char *copy = strdup(name);
    if (!copy)
        return NULL;
    kvr_bench_session *s = &t->sessions[t->nsessions++];
    memset(s, 0, sizeof(*s));
    s->name = copy;
    return s;
}

kvr_bench_turn *kvr_bench_session_add_turn(kvr_bench_trace *t, kvr_bench_session *s)
{
    /* Sessions grow one turn at a time while loading; doubling at powers of two. */
    uint32_t n = s->nturns;
    if ((n & (n - 1)) == 0) {
        size_t nc = n ? (size_t)n * 2 : 1;
        kvr_bench_turn *nt = realloc(s->turns, nc * sizeof(*nt));
        if (!nt)
            return NULL;
        s->turns = nt;
    }
    kvr_bench_turn *turn = &s->turns[s->nturns++];
    memset(turn, 0, sizeof(*turn));
    turn->at_ms = -1;
    t->nturns++;
    return turn;
}

static void session_free(kvr_bench_session *s)
{
    free(s->name);
    free(s->turns);
    if (s->messages)
        json_decref(s->messages);
}

void kvr_bench_trace_drop_empty_tail(kvr_bench_trace *t)
{
    if (t->nsessions && t->sessions[t->nsessions - 1].nturns == 0)
        session_free(&t->sessions[--t->nsessions]);
}

void kvr_bench_trace_free(kvr_bench_trace *t)
{
    for (size_t i = 0; i < t->nsessions; i++)
        session_free(&t->sessions[i]);
    free(t->sessions);
    free(t->blocks);
    memset(t, 0, sizeof(*t));
}

int kvr_bench_each_line(const char *text, size_t len,
                        int (*fn)(const char *line, size_t n, size_t lineno, void *ud), void *ud)
{
    size_t i = 0, lineno = 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t n = end - i;
        lineno++;
        if (n && text[i + n - 1] == '\r')
            n--;
        size_t k = 0;
        while (k < n && (text[i + k] == ' ' || text[i + k] == '\t'))
            k++;
        if (k < n) {
            int rc = fn(text + i, n, lineno, ud);
            if (rc)
                return rc;
        }
        i = end + 1;
    }
    return 0;
}

static size_t json_text_bytes(const json_t *v)
{
    if (json_is_string(v))
        return json_string_length(v);
    if (json_is_array(v)) { /* content parts: [{"type":"text","text":…}] */
        size_t n = 0, i;
        const json_t *part;
        json_array_foreach(v, i, part) n += json_string_length(json_object_get(part, "text"));
        return n;
    }
    return 0;
}

uint32_t kvr_bench_estimate_answer_tokens(const json_t *msg)
{
    size_t bytes = json_text_bytes(json_object_get(msg, "content"));
    const json_t *calls = json_object_get(msg, "tool_calls"), *c;
    size_t i;
    if (json_is_array(calls))
        json_array_foreach(calls, i, c)
        {
            const json_t *fn = json_object_get(c, "function");
            bytes += json_string_length(json_object_get(fn, "name"));
            bytes += json_string_length(json_object_get(fn, "arguments"));
        }
    size_t tok = (bytes + 3) / 4;
    if (tok < 1)
        tok = 1;
    return tok > UINT32_MAX ? UINT32_MAX : (uint32_t)tok;
}

int kvr_bench_conversation_turns(kvr_bench_trace *t, kvr_bench_session *s, size_t max,
                                 bool (*skip)(const json_t *msg))
{
    size_t i;
    json_t *m;
    json_array_foreach(s->messages, i, m)
    {
        if (max && t->nturns >= max)
            break;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant") != 0 || i == 0 || (skip && skip(m)))
            continue;
        kvr_bench_turn *turn = kvr_bench_session_add_turn(t, s);
        if (!turn)
            return -1;
        turn->nmsgs = (uint32_t)i;
        turn->answer_tokens = kvr_bench_estimate_answer_tokens(m);
    }
    return 0;
}

static int read_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    kvr_buf b;
    kvr_buf_init(&b, 0);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        if (kvr_buf_append(&b, chunk, n) < 0) {
            fclose(f);
            kvr_buf_free(&b);
            snprintf(err, errlen, "out of memory reading %s", path);
            return -1;
        }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        kvr_buf_free(&b);
        snprintf(err, errlen, "read error on %s", path);
        return -1;
    }
    if (kvr_buf_append(&b, "", 0) < 0) { /* make sure data is non-NULL and terminated */
        kvr_buf_free(&b);
        snprintf(err, errlen, "out of memory reading %s", path);
        return -1;
    }
    *out = b.data;
    *len = b.len;
    return 0;
}

int kvr_bench_trace_load(kvr_bench_trace *t, kvr_bench_format f, const char *path,
                         size_t max_requests, char *err, size_t errlen)
{
    static int (*const loaders[])(kvr_bench_trace *, const char *, size_t, const char *, size_t,
                                  char *, size_t) = {
        [KVR_BENCH_FMT_TAU] = kvr_bench_load_tau,
        [KVR_BENCH_FMT_SWEAGENT] = kvr_bench_load_sweagent,
        [KVR_BENCH_FMT_SHAREGPT] = kvr_bench_load_sharegpt,
        [KVR_BENCH_FMT_MTBENCH] = kvr_bench_load_mtbench,
        [KVR_BENCH_FMT_MOONCAKE] = kvr_bench_load_mooncake,
        [KVR_BENCH_FMT_AZURE] = kvr_bench_load_azure,
    };
    memset(t, 0, sizeof(*t));
    t->format = f;
    if ((size_t)f >= sizeof(loaders) / sizeof(loaders[0])) {
        snprintf(err, errlen, "unknown format");
        return -1;
    }
    char file[4096], dir[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof(dir), "%s", path);
        snprintf(file, sizeof(file), "%s/%s", path, formats[f].file);
    } else {
        snprintf(file, sizeof(file), "%s", path);
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof(dir), ".");
    }
    char *text;
    size_t len;
    if (read_file(file, &text, &len, err, errlen) < 0)
        return -1;
    int rc = loaders[f](t, text, len, dir, max_requests, err, errlen);
    free(text);
    if (rc == 0 && t->nturns == 0) {
        snprintf(err, errlen, "%s: no %s requests found", file, formats[f].name);
        rc = -1;
    }
    if (rc < 0) {
        kvr_bench_trace_free(t);
        t->format = f;
    }
    return rc;
}

static int dump_cb(const char *buf, size_t size, void *data)
{
    return kvr_buf_append(data, buf, size);
}

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A copy of user message `m` whose text starts with `tag` (string content, or a text part put
 * first); NULL when memory ran out. */
static json_t *tagged_message(const json_t *m, const char *tag)
{
    json_t *c = json_deep_copy(m);
    json_t *content = json_object_get(c, "content");
    int rc = -1;
    if (json_is_string(content)) {
        size_t tl = strlen(tag), cl = json_string_length(content);
        char *txt = malloc(tl + cl + 1);
        if (txt) {
            memcpy(txt, tag, tl);
            memcpy(txt + tl, json_string_value(content), cl);
            rc = json_object_set_new(c, "content", json_stringn(txt, tl + cl));
            free(txt);
        }
    } else if (json_is_array(content)) {
        rc = json_array_insert_new(content, 0, json_pack("{s:s,s:s}", "type", "text", "text", tag));
    } else {
        rc = json_object_set_new(c, "content", json_string(tag));
    }
    if (rc < 0) {
        json_decref(c);
        return NULL;
    }
    return c;
}

int kvr_bench_body(const kvr_bench_trace *t, size_t si, size_t ti, const kvr_bench_body_opts *o,
                   kvr_buf *out)
{
    const kvr_bench_session *s = &t->sessions[si];
    const kvr_bench_turn *turn = &s->turns[ti];
    json_t *body = json_object();
    json_t *msgs = json_array();
    int rc = -1;
    if (!body || !msgs)
        goto done;
    if (s->messages) {
        bool tagged = o->variant == 0;
        char tag[48];
        snprintf(tag, sizeof(tag), "[copy %llx] ", (unsigned long long)o->variant);
        for (uint32_t i = 0; i < turn->nmsgs && i < json_array_size(s->messages); i++) {
            json_t *m = json_array_get(s->messages, i);
            const char *role = json_string_value(json_object_get(m, "role"));
            if (!tagged && role && !strcmp(role, "user")) {
                tagged = true;
                if (json_array_append_new(msgs, tagged_message(m, tag)) < 0)
                    goto done;
            } else if (json_array_append(msgs, m) < 0) {
                goto done;
            }
        }
    } else {
        uint64_t seed = o->variant ? mix64(o->seed ^ mix64(o->variant)) : o->seed;
        kvr_buf text;
        kvr_buf_init(&text, 0);
        int trc = t->format == KVR_BENCH_FMT_MOONCAKE
                      ? kvr_bench_mooncake_prompt(seed, t->blocks + turn->block_off,
                                                  turn->nblocks, turn->input_tokens, &text)
                      : kvr_bench_random_text(seed, si, turn->input_tokens, &text);
        json_t *content = trc == 0 ? json_stringn(text.data ? text.data : "", text.len) : NULL;
        kvr_buf_free(&text);
        if (!content || json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user",
                                                              "content", content)) < 0)
            goto done;
    }
    uint32_t mt = turn->answer_tokens ? turn->answer_tokens : o->default_max_tokens;
    if (o->max_tokens_cap && mt > o->max_tokens_cap)
        mt = o->max_tokens_cap;
    if (mt < 1)
        mt = 1;
    if (json_object_set_new(body, "model", json_string(o->model ? o->model : "")) < 0 ||
        json_object_set(body, "messages", msgs) < 0 ||
        json_object_set_new(body, "max_tokens", json_integer(mt)) < 0 ||
        json_object_set_new(body, "stream", json_true()) < 0 ||
        json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1)) < 0)
        goto done;
    if (o->ignore_eos && json_object_set_new(body, "ignore_eos", json_true()) < 0)
        goto done;
    rc = json_dump_callback(body, dump_cb, out, JSON_COMPACT) == 0 ? 0 : -1;
done:
    json_decref(msgs);
    json_decref(body);
    return rc;
}
