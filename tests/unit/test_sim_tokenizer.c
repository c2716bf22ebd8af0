/* kvroute-sim tokenizer and chat template: determinism, the prefix property across turns, and
 * generated text that tokenizes back to the generated ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "template.h"
#include "tokenizer.h"

static const char *prose =
    "kvroute is an OpenAI-compatible HTTP router, written in C, that sits in front of a fleet of "
    "LLM inference workers. Engines keep the KV cache of every prompt they have processed, in "
    "fixed-size blocks of 16 tokens by default; a request whose prefix is already cached on its "
    "worker skips that part of prefill. Multi-turn chats and agents re-send the whole "
    "conversation every turn, and many sessions share a system prompt and tool schemas, so "
    "where a request lands decides how much GPU work it costs. In 2025, 1234567 requests!";

static void tok(kvr_sim_toks *t, const char *s)
{
    kvr_sim_tokenize(t, s, strlen(s));
}

static void test_deterministic_and_in_vocab(void **state)
{
    (void)state;
    kvr_sim_toks a, b;
    kvr_sim_toks_init(&a, 0);
    kvr_sim_toks_init(&b, 0);
    tok(&a, prose);
    tok(&b, prose);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.ids, b.ids, a.len * sizeof(uint32_t));
    for (size_t i = 0; i < a.len; i++)
        assert_true(a.ids[i] < KVR_SIM_TOK_FIRST_SPECIAL);
    kvr_sim_toks_free(&a);
    kvr_sim_toks_free(&b);
}

static void test_average_piece_is_about_4_bytes(void **state)
{
    (void)state;
    kvr_sim_toks t;
    kvr_sim_toks_init(&t, 0);
    tok(&t, prose);
    double avg = (double)strlen(prose) / (double)t.len;
    print_message("bytes per token: %.2f (%zu tokens)\n", avg, t.len);
    assert_true(avg >= 3.3 && avg <= 4.8);
    kvr_sim_toks_free(&t);
}

static void test_leading_space_belongs_to_word(void **state)
{
    (void)state;
    kvr_sim_toks t;
    kvr_sim_toks_init(&t, 0);
    tok(&t, "a  cat");
    /* "a", " " (run minus the attached space), " cat" */
    assert_int_equal(t.len, 3);
    assert_int_equal(t.ids[2], kvr_sim_piece_id(" cat", 4));
    kvr_sim_toks_free(&t);
    tok(&t, " cat and a much longer tail");
    assert_int_equal(t.ids[0], kvr_sim_piece_id(" cat", 4)); /* 8-byte load path */
    kvr_sim_toks_free(&t);
    tok(&t, "1234567");
    assert_int_equal(t.len, 3); /* 123 456 7 */
    kvr_sim_toks_free(&t);
}

static void test_cap_counts_total(void **state)
{
    (void)state;
    kvr_sim_toks t;
    kvr_sim_toks_init(&t, 5);
    tok(&t, prose);
    assert_int_equal(t.len, 5);
    assert_true(t.total > 50);
    kvr_sim_toks_free(&t);
}

static void test_generated_text_round_trips(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed < 50; seed++) {
        char text[4096];
        size_t off = 0;
        uint32_t ids[100];
        for (size_t i = 0; i < 100; i++) {
            const char *p;
            size_t n;
            ids[i] = kvr_sim_gen_token(seed, i, &p, &n);
            memcpy(text + off, p, n);
            off += n;
        }
        kvr_sim_toks t;
        kvr_sim_toks_init(&t, 0);
        kvr_sim_tokenize(&t, text, off);
        assert_int_equal(t.len, 100);
        assert_memory_equal(t.ids, ids, sizeof(ids));
        kvr_sim_toks_free(&t);
    }
}

static json_t *msg(const char *role, const char *content)
{
    return json_pack("{s:s,s:s}", "role", role, "content", content);
}

static void render(kvr_sim_toks *t, json_t *messages, json_t *tools, int gen)
{
    const char *err = NULL, *param = NULL;
    kvr_sim_toks_init(t, 0);
    assert_int_equal(kvr_sim_render_chat(t, messages, tools, gen, &err, &param), 0);
}

/* Turn N's prompt is a prefix of turn N+1's, and the reply generated at turn N re-renders to
 * the ids that were generated. */
static void test_conversation_prefix_property(void **state)
{
    (void)state;
    json_t *tools = json_pack(
        "[{s:s,s:{s:s,s:s,s:{s:s}}}]", "type", "function", "function", "name", "get_weather",
        "description", "Weather for a city", "parameters", "type", "object");
    json_t *messages = json_array();
    json_array_append_new(messages, msg("system", "You are a helpful assistant."));
    json_array_append_new(messages, msg("user", "What is the weather in Paris?"));
    kvr_sim_toks prev;
    render(&prev, messages, tools, 1);
    for (int turn = 0; turn < 5; turn++) {
        /* the engine's answer to `prev` */
        uint64_t seed = 42 + (uint64_t)turn;
        char reply[512];
        size_t off = 0;
        uint32_t gen[20];
        for (size_t i = 0; i < 20; i++) {
            const char *p;
            size_t n;
            gen[i] = kvr_sim_gen_token(seed, i, &p, &n);
            memcpy(reply + off, p, n);
            off += n;
        }
        reply[off] = '\0';
        json_t *asst = json_pack("{s:s,s:s}", "role", "assistant", "content", reply);
        if (turn == 2) /* an agent turn: tool call, then the tool's result */
            json_object_set_new(
                asst, "tool_calls",
                json_pack("[{s:s,s:s,s:{s:s,s:s}}]", "id", "call_1", "type", "function",
                          "function", "name", "get_weather", "arguments", "{\"city\":\"Paris\"}"));
        json_array_append_new(messages, asst);
        if (turn == 2)
            json_array_append_new(messages, json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                      "tool_call_id", "call_1", "content", "21C"));
        json_array_append_new(messages, msg("user", "And tomorrow?"));
        kvr_sim_toks next;
        render(&next, messages, tools, 1);
        assert_true(next.len > prev.len + 20);
        assert_memory_equal(next.ids, prev.ids, prev.len * sizeof(uint32_t));
        assert_memory_equal(next.ids + prev.len, gen, sizeof(gen));
        kvr_sim_toks_free(&prev);
        prev = next;
    }
    kvr_sim_toks_free(&prev);
    json_decref(messages);
    json_decref(tools);
}

static void test_template_shape(void **state)
{
    (void)state;
    json_t *m = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
    kvr_sim_toks t;
    render(&t, m, NULL, 0);
    assert_int_equal(t.ids[0], KVR_SIM_TOK_BOS);
    assert_int_equal(t.ids[1], KVR_SIM_TOK_START_HEADER);
    assert_int_equal(t.ids[t.len - 1], KVR_SIM_TOK_EOT);
    size_t without = t.len;
    kvr_sim_toks_free(&t);
    render(&t, m, NULL, 1);
    assert_int_equal(t.ids[without], KVR_SIM_TOK_START_HEADER);
    kvr_sim_toks_free(&t);
    json_decref(m);
}

static void test_media_parts_differ(void **state)
{
    (void)state;
    json_t *a = json_pack("[{s:s,s:[{s:s,s:s},{s:s,s:{s:s}}]}]", "role", "user", "content",
                          "type", "text", "text", "look", "type", "image_url", "image_url", "url",
                          "https://x/a.png");
    json_t *b = json_pack("[{s:s,s:[{s:s,s:s},{s:s,s:{s:s}}]}]", "role", "user", "content",
                          "type", "text", "text", "look", "type", "image_url", "image_url", "url",
                          "https://x/b.png");
    kvr_sim_toks ta, tb;
    render(&ta, a, NULL, 1);
    render(&tb, b, NULL, 1);
    assert_int_equal(ta.len, tb.len);
    assert_memory_not_equal(ta.ids, tb.ids, ta.len * sizeof(uint32_t));
    kvr_sim_toks_free(&ta);
    kvr_sim_toks_free(&tb);
    json_decref(a);
    json_decref(b);
}

static void test_bad_shapes_refused(void **state)
{
    (void)state;
    const char *bad[] = {
        "[]", "{}", "[1]", "[{\"content\":\"x\"}]", "[{\"role\":\"user\",\"content\":5}]",
        "[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]",
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]",
        "[{\"role\":\"assistant\",\"tool_calls\":{}}]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        json_t *m = json_loads(bad[i], 0, NULL);
        kvr_sim_toks t;
        kvr_sim_toks_init(&t, 0);
        const char *err = NULL, *param = NULL;
        assert_int_equal(kvr_sim_render_chat(&t, m, NULL, 1, &err, &param), -1);
        assert_non_null(err);
        kvr_sim_toks_free(&t);
        json_decref(m);
    }
}

static void test_completion_prompts(void **state)
{
    (void)state;
    const char *err = NULL;
    kvr_sim_toks t;
    json_t *p = json_loads("\"hello world\"", JSON_DECODE_ANY, NULL);
    kvr_sim_toks_init(&t, 0);
    assert_int_equal(kvr_sim_render_completion(&t, p, &err), 0);
    assert_int_equal(t.ids[0], KVR_SIM_TOK_BOS);
    assert_int_equal(t.len, 3);
    kvr_sim_toks_free(&t);
    json_decref(p);
    p = json_loads("[[5, 6, 7]]", 0, NULL);
    assert_int_equal(kvr_sim_render_completion(&t, p, &err), 0);
    assert_int_equal(t.len, 3);
    assert_int_equal(t.ids[2], 7);
    kvr_sim_toks_free(&t);
    json_decref(p);
    const char *bad[] = {"[]", "[\"a\",\"b\"]", "[1, -2]", "[1, 999999999]", "5", "[1.5]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        p = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        assert_int_equal(kvr_sim_render_completion(&t, p, &err), -1);
        kvr_sim_toks_free(&t);
        json_decref(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic_and_in_vocab),
        cmocka_unit_test(test_average_piece_is_about_4_bytes),
        cmocka_unit_test(test_leading_space_belongs_to_word),
        cmocka_unit_test(test_cap_counts_total),
        cmocka_unit_test(test_generated_text_round_trips),
        cmocka_unit_test(test_conversation_prefix_property),
        cmocka_unit_test(test_template_shape),
        cmocka_unit_test(test_media_parts_differ),
        cmocka_unit_test(test_bad_shapes_refused),
        cmocka_unit_test(test_completion_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
