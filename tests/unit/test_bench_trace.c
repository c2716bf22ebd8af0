/* Trace loaders: small samples of every format become the right sessions, turns and request
 * bodies; the shipped traces have the request counts their SOURCE.md states. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace.h"

static char g_dir[64];

static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvr-bench-test-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Parses turn `ti` of session `si` into a JSON object. */
static json_t *body_of(const kvr_bench_trace *t, size_t si, size_t ti, uint32_t cap)
{
    kvr_bench_body_opts o = {.model = "m", .max_tokens_cap = cap, .default_max_tokens = 99, .seed = 3};
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_bench_body(t, si, ti, &o, &b), 0);
    json_t *j = json_loadb(b.data, b.len, 0, NULL);
    assert_non_null(j);
    kvr_buf_free(&b);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "m");
    assert_true(json_is_true(json_object_get(j, "stream")));
    assert_true(json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage")));
    return j;
}

static void test_formats(void **state)
{
    (void)state;
    kvr_bench_format f;
    const char *names[] = {"tau", "sweagent", "sharegpt", "mtbench", "mooncake", "azure"};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(kvr_bench_format_parse(names[i], &f), 0);
        assert_string_equal(kvr_bench_format_name(f), names[i]);
        assert_int_equal(kvr_bench_format_is_conversation(f), i < 4);
    }
    assert_int_equal(kvr_bench_format_parse("csv", &f), -1);
}

static const char TAU[] =
    "{\"task_id\":0,\"trial\":1,\"reward\":1,\"messages\":["
    "{\"role\":\"system\",\"content\":\"policy\"},"
    "{\"role\":\"user\",\"content\":\"hi\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_user\",\"arguments\":\"{\\\"id\\\":1}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"name\":\"get_user\",\"content\":\"{}\"},"
    "{\"role\":\"assistant\",\"content\":\"0123456789abcdef\"}]}\n"
    "this line is not JSON\n"
    "\n"
    "{\"task_id\":1,\"trial\":0,\"messages\":[{\"role\":\"system\",\"content\":\"policy\"},"
    "{\"role\":\"user\",\"content\":\"bye\"},{\"role\":\"assistant\",\"content\":\"ok\"}]}\n";

static void test_tau(void **state)
{
    (void)state;
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, write_file("tau.jsonl", TAU), 0, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, 2);
    assert_int_equal(t.nturns, 3);
    assert_false(t.has_timestamps);
    assert_string_equal(t.sessions[0].name, "tau-task0-trial1");
    assert_int_equal(t.sessions[0].nturns, 2);
    assert_int_equal(t.sessions[0].turns[0].nmsgs, 2);
    assert_int_equal(t.sessions[0].turns[1].nmsgs, 4);
    /* "get_user" + {"id":1} = 8 + 8 bytes → 4 tokens; 16 bytes of text → 4 tokens. */
    assert_int_equal(t.sessions[0].turns[0].answer_tokens, 4);
    assert_int_equal(t.sessions[0].turns[1].answer_tokens, 4);
    /* Turn 2 re-sends the recorded tool call and tool result as recorded. */
    json_t *j = body_of(&t, 0, 1, 0);
    json_t *msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    json_t *a = json_array_get(msgs, 2);
    assert_true(json_is_null(json_object_get(a, "content")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(
                            json_object_get(a, "tool_calls"), 0), "function"), "arguments")),
                        "{\"id\":1}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 3), "tool_call_id")), "c1");
    assert_int_equal(json_integer_value(json_object_get(j, "max_tokens")), 4);
    json_decref(j);
    /* The cap bounds max_tokens; max_requests cuts a conversation after its first turns. */
    j = body_of(&t, 0, 1, 2);
    assert_int_equal(json_integer_value(json_object_get(j, "max_tokens")), 2);
    json_decref(j);
    kvr_bench_trace_free(&t);
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, write_file("tau.jsonl", TAU), 1, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, 1);
    assert_int_equal(t.nturns, 1);
    kvr_bench_trace_free(&t);
}

static void test_tau_prefix_growth(void **state)
{
    (void)state;
    /* Each turn's body is the previous turn's messages plus more: the serialized message list of
     * turn N is a prefix of turn N+1's (what a prefix cache needs). */
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, write_file("tau.jsonl", TAU), 0, err, sizeof(err)), 0);
    kvr_bench_body_opts o = {.model = "m", .default_max_tokens = 1};
    kvr_buf b1, b2;
    kvr_buf_init(&b1, 0);
    kvr_buf_init(&b2, 0);
    assert_int_equal(kvr_bench_body(&t, 0, 0, &o, &b1), 0);
    assert_int_equal(kvr_bench_body(&t, 0, 1, &o, &b2), 0);
    const char *m1 = strstr(b1.data, "\"messages\""), *m2 = strstr(b2.data, "\"messages\"");
    const char *end1 = strstr(m1, "],\"max_tokens\"");
    assert_non_null(end1);
    assert_memory_equal(m1, m2, (size_t)(end1 - m1));
    kvr_buf_free(&b1);
    kvr_buf_free(&b2);
    kvr_bench_trace_free(&t);
}

static const char SWE[] =
    "{\"source_path\":\"a/b/run.traj\",\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are SWE-agent\"},"
    "{\"role\":\"user\",\"content\":\"demo\",\"is_demo\":true},"
    "{\"role\":\"assistant\",\"content\":\"demo answer\",\"is_demo\":true},"
    "{\"role\":\"user\",\"content\":\"issue\"},"
    "{\"role\":\"assistant\",\"content\":\"look\",\"tool_calls\":[{\"id\":\"x\",\"type\":\"function\","
    "\"function\":{\"name\":\"open\",\"arguments\":\"{}\"}}]},"
    "{\"role\":\"tool\",\"content\":\"file\",\"tool_call_ids\":[\"x\"]},"
    "{\"role\":\"assistant\",\"content\":\"done\"}]}\n";

static void test_sweagent(void **state)
{
    (void)state;
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_SWEAGENT, write_file("swe.jsonl", SWE), 0, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, 1);
    assert_int_equal(t.nturns, 2); /* the demo assistant message is context, not a request */
    assert_string_equal(t.sessions[0].name, "swe-1-run.traj");
    assert_int_equal(t.sessions[0].turns[0].nmsgs, 4);
    json_t *j = body_of(&t, 0, 1, 0);
    json_t *msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 6);
    for (size_t i = 0; i < 6; i++)
        assert_null(json_object_get(json_array_get(msgs, i), "is_demo"));
    json_t *tool = json_array_get(msgs, 5);
    assert_string_equal(json_string_value(json_object_get(tool, "tool_call_id")), "x");
    assert_null(json_object_get(tool, "tool_call_ids"));
    json_decref(j);
    kvr_bench_trace_free(&t);
}

static void test_sharegpt(void **state)
{
    (void)state;
    const char *text =
        "{\"id\":\"abc_0\",\"conversations\":[{\"from\":\"human\",\"value\":\"q1\"},"
        "{\"from\":\"gpt\",\"value\":\"a1\"},{\"from\":\"human\",\"value\":\"q2\"},"
        "{\"from\":\"gpt\",\"value\":\"a2\"}]}\n"
        "{\"id\":\"bad\",\"conversations\":[{\"from\":\"alien\",\"value\":\"?\"}]}\n";
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_SHAREGPT, write_file("sg.jsonl", text), 0, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, 1);
    assert_int_equal(t.nturns, 2);
    json_t *j = body_of(&t, 0, 1, 0);
    json_t *msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "user");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "a1");
    json_decref(j);
    kvr_bench_trace_free(&t);
}

static void test_mtbench(void **state)
{
    (void)state;
    write_file("reference_answer_gpt-4.jsonl",
               "{\"question_id\":1,\"choices\":[{\"index\":0,\"turns\":[\"ref one\",\"ref two\"]}]}\n");
    const char *q = write_file("question.jsonl",
                               "{\"question_id\":1,\"category\":\"x\",\"turns\":[\"Q1\",\"Q2\"]}\n"
                               "{\"question_id\":2,\"category\":\"x\",\"turns\":[\"R1\",\"R2\"]}\n");
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_MTBENCH, q, 0, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, 2);
    assert_int_equal(t.nturns, 4);
    json_t *j = body_of(&t, 0, 1, 0);
    json_t *msgs = json_object_get(j, "messages");
    assert_int_equal(json_array_size(msgs), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "ref one");
    json_decref(j);
    /* No reference answer: a stand-in assistant message, default length, no private marker. */
    j = body_of(&t, 1, 1, 0);
    msgs = json_object_get(j, "messages");
    assert_int_equal(json_object_size(json_array_get(msgs, 1)), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "max_tokens")), 256);
    json_decref(j);
    kvr_bench_trace_free(&t);
}

static void test_mooncake(void **state)
{
    (void)state;
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [0, 1]}\n"
        "{\"timestamp\": 250, \"input_length\": 1100, \"output_length\": 900, \"hash_ids\": [0, 1, 2]}\n"
        "{\"timestamp\": 300, \"input_length\": -1, \"output_length\": 1, \"hash_ids\": [0]}\n";
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_MOONCAKE, write_file("mc.jsonl", text), 0, err, sizeof(err)), 0);
    assert_true(t.has_timestamps);
    assert_int_equal(t.nsessions, 2);
    assert_int_equal(t.nturns, 2);
    assert_int_equal(t.nblocks, 5);
    assert_int_equal(t.sessions[1].turns[0].at_ms, 250);
    assert_int_equal(t.sessions[1].turns[0].nblocks, 3);
    json_t *j0 = body_of(&t, 0, 0, 512), *j1 = body_of(&t, 1, 0, 512);
    assert_int_equal(json_integer_value(json_object_get(j0, "max_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(j1, "max_tokens")), 512);
    const char *p0 = json_string_value(json_object_get(json_array_get(json_object_get(j0, "messages"), 0), "content"));
    const char *p1 = json_string_value(json_object_get(json_array_get(json_object_get(j1, "messages"), 0), "content"));
    assert_int_equal(strlen(p0), 700 * 4);
    assert_int_equal(strlen(p1), 1100 * 4);
    /* Both start with blocks 0 and 1: the 700-token prompt is a prefix of the 1100-token one. */
    assert_memory_equal(p0, p1, 700 * 4);
    json_decref(j0);
    json_decref(j1);
    kvr_bench_trace_free(&t);
}

static void test_azure(void **state)
{
    (void)state;
    const char *text = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                       "2023-11-16 18:15:46.6805900,374,44\r\n"
                       "2023-11-16 18:15:50.9951690,396,109\n"
                       "garbage\n"
                       "2023-11-17 00:00:00,10,1\n";
    kvr_bench_trace t;
    char err[256];
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_AZURE, write_file("az.csv", text), 0, err, sizeof(err)), 0);
    assert_int_equal(t.nturns, 3);
    assert_int_equal(t.sessions[0].turns[0].at_ms, 0);
    assert_int_equal(t.sessions[1].turns[0].at_ms, 4315); /* 50.995 − 46.680 */
    /* Across midnight: 5 h 44 min 13.32 s after the first row. */
    assert_int_equal(t.sessions[2].turns[0].at_ms, 20653320);
    assert_int_equal(t.sessions[1].turns[0].input_tokens, 396);
    json_t *a = body_of(&t, 0, 0, 0), *b = body_of(&t, 1, 0, 0);
    const char *pa = json_string_value(json_object_get(json_array_get(json_object_get(a, "messages"), 0), "content"));
    const char *pb = json_string_value(json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content"));
    assert_int_equal(strlen(pa), 374 * 4);
    assert_true(strncmp(pa, pb, 8) != 0); /* Azure prompts share nothing */
    json_decref(a);
    json_decref(b);
    kvr_bench_trace_free(&t);
}

static void test_errors(void **state)
{
    (void)state;
    kvr_bench_trace t;
    char err[256] = "";
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, "/nonexistent/file", 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, write_file("empty.jsonl", "\n\n"), 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no tau requests"));
    assert_int_equal(t.nsessions, 0);
    /* A folder works when it holds the format's usual file name. */
    write_file("trajectories.jsonl", TAU);
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_TAU, g_dir, 0, err, sizeof(err)), 0);
    assert_int_equal(t.nturns, 3);
    kvr_bench_trace_free(&t);
}

/* The real datasets: counts as their SOURCE.md states. Looked up in the project's data/ first,
 * then in ../shared/data; skipped when neither has them. */
static int find_dataset(const char *name, char *out, size_t n)
{
    const char *roots[] = {"data", "../shared/data", "../../shared/data"};
    struct stat st;
    for (size_t i = 0; i < 3; i++) {
        snprintf(out, n, "%s/%s", roots[i], name);
        if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
    }
    return -1;
}

static void check_dataset(kvr_bench_format f, const char *name, size_t sessions, size_t turns)
{
    char dir[256], err[256];
    if (find_dataset(name, dir, sizeof(dir)) < 0) {
        print_message("skipped: %s not found\n", name);
        return;
    }
    kvr_bench_trace t;
    assert_int_equal(kvr_bench_trace_load(&t, f, dir, 0, err, sizeof(err)), 0);
    assert_int_equal(t.nsessions, sessions);
    assert_int_equal(t.nturns, turns);
    for (size_t i = 0; i < t.nsessions; i++)
        for (size_t k = 0; k + 1 < t.sessions[i].nturns; k++)
            assert_true(t.sessions[i].turns[k].nmsgs < t.sessions[i].turns[k + 1].nmsgs);
    kvr_bench_trace_free(&t);
}

static void test_shipped_counts(void **state)
{
    (void)state;
    check_dataset(KVR_BENCH_FMT_TAU, "tau-bench-airline-gpt4o", 140, 2023);
    check_dataset(KVR_BENCH_FMT_SWEAGENT, "swe-agent-trajectories", 16, 142);
    check_dataset(KVR_BENCH_FMT_SHAREGPT, "sharegpt-multiturn-sample", 275, 1303);
    check_dataset(KVR_BENCH_FMT_MTBENCH, "mt-bench", 80, 160);
    check_dataset(KVR_BENCH_FMT_MOONCAKE, "mooncake-fast25-conversation", 12031, 12031);
    check_dataset(KVR_BENCH_FMT_AZURE, "azure-llm-inference-2023-conv", 19366, 19366);
}

static void test_mooncake_shipped_shape(void **state)
{
    (void)state;
    char dir[256], err[256];
    if (find_dataset("mooncake-fast25-conversation", dir, sizeof(dir)) < 0) {
        skip();
        return;
    }
    kvr_bench_trace t;
    assert_int_equal(kvr_bench_trace_load(&t, KVR_BENCH_FMT_MOONCAKE, dir, 0, err, sizeof(err)), 0);
    /* SOURCE.md: 288,500 blocks, len(hash_ids) == ceil(input_length / 512), every request starts
     * with block 0, last arrival at 3,537 s. */
    assert_int_equal(t.nblocks, 288500);
    for (size_t i = 0; i < t.nsessions; i++) {
        const kvr_bench_turn *tu = &t.sessions[i].turns[0];
        assert_int_equal(tu->nblocks, (tu->input_tokens + 511) / 512);
        assert_int_equal(t.blocks[tu->block_off], 0);
    }
    assert_int_equal(t.sessions[t.nsessions - 1].turns[0].at_ms, 3536999);
    kvr_bench_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_tau),
        cmocka_unit_test(test_tau_prefix_growth),
        cmocka_unit_test(test_sweagent),
        cmocka_unit_test(test_sharegpt),
        cmocka_unit_test(test_mtbench),
        cmocka_unit_test(test_mooncake),
        cmocka_unit_test(test_azure),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_shipped_counts),
        cmocka_unit_test(test_mooncake_shipped_shape),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
