/* Loaders of the conversation datasets: tau-bench, SWE-agent, ShareGPT, MT-Bench. Each
 * conversation becomes a session whose messages are normalised to OpenAI chat form once; the
 * turns then only record how many of them each request carries. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

/* State threaded through kvr_bench_each_line(). */
typedef struct {
    kvr_bench_trace *t;
    size_t max;
    const char *what;
    size_t skipped;
    int (*row)(kvr_bench_trace *t, json_t *row, size_t lineno, size_t max);
} jsonl_ctx;

static int jsonl_line(const char *line, size_t n, size_t lineno, void *ud)
{
    jsonl_ctx *c = ud;
    if (c->max && c->t->nturns >= c->max)
        return 1; /* enough requests: stop reading */
    json_error_t je;
    json_t *row = json_loadb(line, n, 0, &je);
    if (!row || !json_is_object(row)) {
        fprintf(stderr, "kvroute-bench: %s line %zu: not a JSON object (%s), skipped\n", c->what,
                lineno, row ? "wrong type" : je.text);
        c->skipped++;
        json_decref(row);
        return 0;
    }
    int rc = c->row(c->t, row, lineno, c->max);
    json_decref(row);
    if (rc > 0) {
        fprintf(stderr, "kvroute-bench: %s line %zu: unexpected shape, skipped\n", c->what,
                lineno);
        c->skipped++;
        return 0;
    }
    return rc < 0 ? -1 : 0;
}

static int run_jsonl(kvr_bench_trace *t, const char *text, size_t len, size_t max,
                     const char *what, int (*row)(kvr_bench_trace *, json_t *, size_t, size_t),
                     char *err, size_t errlen)
{
    jsonl_ctx c = {.t = t, .max = max, .what = what, .row = row};
    if (kvr_bench_each_line(text, len, jsonl_line, &c) < 0) {
        snprintf(err, errlen, "%s: out of memory", what);
        return -1;
    }
    return 0;
}

/* Adds a session for a conversation; takes ownership of msgs. Returns 0, 1 (bad shape) or -1. */
static int add_conversation(kvr_bench_trace *t, const char *name, json_t *msgs, size_t max,
                            bool (*skip)(const json_t *))
{
    kvr_bench_session *s = kvr_bench_trace_add_session(t, name);
    if (!s) {
        json_decref(msgs);
        return -1;
    }
    s->messages = msgs;
    if (kvr_bench_conversation_turns(t, s, max, skip) < 0)
        return -1;
    kvr_bench_trace_drop_empty_tail(t);
    return 0;
}

/* ---- tau-bench: messages are OpenAI chat messages already. */
static int tau_row(kvr_bench_trace *t, json_t *row, size_t lineno, size_t max)
{
    json_t *msgs = json_object_get(row, "messages");
    if (!json_is_array(msgs))
        return 1;
    char name[96];
    json_t *task = json_object_get(row, "task_id"), *trial = json_object_get(row, "trial");
    if (json_is_integer(task) && json_is_integer(trial))
        snprintf(name, sizeof(name), "tau-task%" JSON_INTEGER_FORMAT "-trial%" JSON_INTEGER_FORMAT,
                 json_integer_value(task), json_integer_value(trial));
    else
        snprintf(name, sizeof(name), "tau-line%zu", lineno);
    return add_conversation(t, name, json_incref(msgs), max, NULL);
}

int kvr_bench_load_tau(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                       size_t max, char *err, size_t errlen)
{
    (void)dir;
    return run_jsonl(t, text, len, max, "tau-bench", tau_row, err, errlen);
}

/* ---- SWE-agent: drop the is_demo marker (not an OpenAI field) and turn SWE-agent's
 * `tool_call_ids` list into OpenAI's `tool_call_id`. Demonstration assistant messages are
 * context, not requests. */
static bool swe_skip(const json_t *m)
{
    return json_is_true(json_object_get(m, "is_demo"));
}

static int swe_row(kvr_bench_trace *t, json_t *row, size_t lineno, size_t max)
{
    json_t *src = json_object_get(row, "messages");
    if (!json_is_array(src))
        return 1;
    json_t *msgs = json_array();
    if (!msgs)
        return -1;
    size_t i;
    json_t *m;
    json_array_foreach(src, i, m)
    {
        if (!json_is_object(m)) {
            json_decref(msgs);
            return 1;
        }
        json_t *c = json_deep_copy(m);
        if (!c)
            goto oom;
        json_t *ids = json_object_get(c, "tool_call_ids");
        if (ids) {
            json_t *first = json_array_get(ids, 0);
            if (json_is_string(first) && !json_object_get(c, "tool_call_id"))
                json_object_set(c, "tool_call_id", first);
            json_object_del(c, "tool_call_ids");
        }
        json_object_del(c, "is_demo"); /* the original row keeps it for swe_skip() */
        if (json_array_append_new(msgs, c) < 0)
            goto oom;
    }
    const char *path = json_string_value(json_object_get(row, "source_path"));
    char name[160];
    if (path) {
        const char *base = strrchr(path, '/');
        snprintf(name, sizeof(name), "swe-%zu-%s", lineno, base ? base + 1 : path);
    } else {
        snprintf(name, sizeof(name), "swe-%zu", lineno);
    }
    kvr_bench_session *s = kvr_bench_trace_add_session(t, name);
    if (!s)
        goto oom;
    s->messages = msgs;
    /* Turns: one per non-demo assistant message (the demo flag is read from the source row). */
    json_array_foreach(msgs, i, m)
    {
        if (max && t->nturns >= max)
            break;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant") != 0 || i == 0 || swe_skip(json_array_get(src, i)))
            continue;
        kvr_bench_turn *turn = kvr_bench_session_add_turn(t, s);
        if (!turn)
            return -1;
        turn->nmsgs = (uint32_t)i;
        turn->answer_tokens = kvr_bench_estimate_answer_tokens(m);
    }
    kvr_bench_trace_drop_empty_tail(t);
    return 0;
oom:
    json_decref(msgs);
    return -1;
}

int kvr_bench_load_sweagent(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen)
{
    (void)dir;
    return run_jsonl(t, text, len, max, "SWE-agent", swe_row, err, errlen);
}

/* ---- ShareGPT: {"from": "human"|"gpt", "value"} → {"role": "user"|"assistant", "content"}. */
static int sharegpt_row(kvr_bench_trace *t, json_t *row, size_t lineno, size_t max)
{
    json_t *conv = json_object_get(row, "conversations");
    if (!json_is_array(conv))
        return 1;
    json_t *msgs = json_array();
    if (!msgs)
        return -1;
    size_t i;
    json_t *m;
    json_array_foreach(conv, i, m)
    {
        const char *from = json_string_value(json_object_get(m, "from"));
        json_t *value = json_object_get(m, "value");
        const char *role = NULL;
        if (from && (!strcmp(from, "human") || !strcmp(from, "user")))
            role = "user";
        else if (from && (!strcmp(from, "gpt") || !strcmp(from, "assistant") ||
                          !strcmp(from, "chatgpt")))
            role = "assistant";
        else if (from && !strcmp(from, "system"))
            role = "system";
        if (!role || !json_is_string(value)) {
            json_decref(msgs);
            return 1;
        }
        if (json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", value)) <
            0) {
            json_decref(msgs);
            return -1;
        }
    }
    const char *id = json_string_value(json_object_get(row, "id"));
    char name[160];
    if (id)
        snprintf(name, sizeof(name), "sharegpt-%s", id);
    else
        snprintf(name, sizeof(name), "sharegpt-line%zu", lineno);
    return add_conversation(t, name, msgs, max, NULL);
}

int kvr_bench_load_sharegpt(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen)
{
    (void)dir;
    return run_jsonl(t, text, len, max, "ShareGPT", sharegpt_row, err, errlen);
}

/* ---- MT-Bench: turn 1 = [q1]; turn 2 = [q1, a1, q2]. a1 is GPT-4's reference answer where
 * FastChat recorded one (30 of 80 questions); otherwise a fixed stand-in sentence, because the
 * dataset holds no answer to re-send and a client would re-send whatever it was given. */
#define MTBENCH_STANDIN "(The first answer is not recorded in MT-Bench; this stands in for it.)"
#define MTBENCH_DEFAULT_ANSWER_TOKENS 256

typedef struct {
    json_t *answers; /* question_id (decimal string) → [answer1, answer2] */
} mt_ctx;

static mt_ctx g_mt; /* loader-local state; loading is single-threaded */

static int mt_answer_line(const char *line, size_t n, size_t lineno, void *ud)
{
    (void)lineno;
    (void)ud;
    json_t *row = json_loadb(line, n, 0, NULL);
    json_t *qid = json_object_get(row, "question_id");
    json_t *turns = json_object_get(json_array_get(json_object_get(row, "choices"), 0), "turns");
    if (json_is_integer(qid) && json_is_array(turns)) {
        char key[32];
        snprintf(key, sizeof(key), "%" JSON_INTEGER_FORMAT, json_integer_value(qid));
        json_object_set(g_mt.answers, key, turns);
    }
    json_decref(row);
    return 0;
}

static int mt_row(kvr_bench_trace *t, json_t *row, size_t lineno, size_t max)
{
    json_t *qid = json_object_get(row, "question_id");
    json_t *turns = json_object_get(row, "turns");
    if (!json_is_array(turns) || json_array_size(turns) == 0)
        return 1;
    char key[32], name[64];
    if (json_is_integer(qid)) {
        snprintf(key, sizeof(key), "%" JSON_INTEGER_FORMAT, json_integer_value(qid));
        snprintf(name, sizeof(name), "mtbench-%s", key);
    } else {
        key[0] = '\0';
        snprintf(name, sizeof(name), "mtbench-line%zu", lineno);
    }
    json_t *answers = key[0] ? json_object_get(g_mt.answers, key) : NULL;
    json_t *msgs = json_array();
    if (!msgs)
        return -1;
    size_t i;
    json_t *q;
    json_array_foreach(turns, i, q)
    {
        if (!json_is_string(q)) {
            json_decref(msgs);
            return 1;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", q));
        json_t *a = json_array_get(answers, i);
        json_t *msg = json_is_string(a)
                          ? json_pack("{s:s,s:O}", "role", "assistant", "content", a)
                          : json_pack("{s:s,s:s,s:b}", "role", "assistant", "content",
                                      MTBENCH_STANDIN, "_unrecorded", 1);
        json_array_append_new(msgs, msg);
    }
    kvr_bench_session *s = kvr_bench_trace_add_session(t, name);
    if (!s) {
        json_decref(msgs);
        return -1;
    }
    s->messages = msgs;
    if (kvr_bench_conversation_turns(t, s, max, NULL) < 0)
        return -1;
    /* Unrecorded answers: unknown length (default max_tokens); strip the private marker. */
    for (uint32_t k = 0; k < s->nturns; k++) {
        json_t *m = json_array_get(msgs, s->turns[k].nmsgs);
        if (json_object_get(m, "_unrecorded")) {
            s->turns[k].answer_tokens = MTBENCH_DEFAULT_ANSWER_TOKENS;
        }
    }
    json_array_foreach(msgs, i, q) json_object_del(q, "_unrecorded");
    /* The final assistant message is never sent; drop it so the session holds only context. */
    kvr_bench_trace_drop_empty_tail(t);
    return 0;
}

int kvr_bench_load_mtbench(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                           size_t max, char *err, size_t errlen)
{
    g_mt.answers = json_object();
    char path[4200];
    snprintf(path, sizeof(path), "%s/reference_answer_gpt-4.jsonl", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        kvr_buf b;
        kvr_buf_init(&b, 0);
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
            kvr_buf_append(&b, chunk, n);
        fclose(f);
        if (b.data)
            kvr_bench_each_line(b.data, b.len, mt_answer_line, NULL);
        kvr_buf_free(&b);
    }
    int rc = run_jsonl(t, text, len, max, "MT-Bench", mt_row, err, errlen);
    json_decref(g_mt.answers);
    g_mt.answers = NULL;
    return rc;
}
