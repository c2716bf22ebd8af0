/* Routing text of Anthropic Messages requests (routing/keys.h, routing/anthropic.h): turn N's
 * text is a byte prefix of turn N+1's, cache_control markers never change it, tools are in
 * name order, each block kind counts as documented, and a reply taught after turn N frames
 * exactly as turn N+1 sends it back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "routing/anthropic.h"
#include "routing/keys.h"

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s: %s", e.text, s);
    return j;
}

static kvr_buf text_of_json(const json_t *body, kvr_route_kind kind)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    assert_int_equal(kvr_route_text_build(body, kind, &b), 0);
    return b;
}

static kvr_buf text_of(const char *body)
{
    json_t *j = parse(body);
    kvr_buf b = text_of_json(j, KVR_ROUTE_MESSAGES);
    json_decref(j);
    return b;
}

static int same(const kvr_buf *a, const kvr_buf *b)
{
    return a->len == b->len && (!a->len || memcmp(a->data, b->data, a->len) == 0);
}

static int is_prefix(const kvr_buf *a, const kvr_buf *b)
{
    return a->len < b->len && (!a->len || memcmp(a->data, b->data, a->len) == 0);
}

static int contains(const kvr_buf *t, const char *s)
{
    return t->len && memmem(t->data, t->len, s, strlen(s)) != NULL;
}

/* A three-turn agent conversation: system prompt, two tools, a tool_use and its tool_result.
 * Clients move cache_control to the newest blocks each turn. */
#define TOOLS                                                                                    \
    "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather for a city\","              \
    "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}},"  \
    "{\"name\":\"add\",\"description\":\"Adds\",\"input_schema\":{\"type\":\"object\"},"        \
    "\"cache_control\":{\"type\":\"ephemeral\"}}]"
#define SYSTEM                                                                                   \
    "\"system\":[{\"type\":\"text\",\"text\":\"You are a weather agent.\","                     \
    "\"cache_control\":{\"type\":\"ephemeral\"}}]"
#define U1 "{\"role\":\"user\",\"content\":\"Weather in Paris?\"}"
#define U1_CC                                                                                    \
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather in Paris?\","        \
    "\"cache_control\":{\"type\":\"ephemeral\"}}]}"
#define A1                                                                                       \
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me check.\"},"      \
    "{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\","                      \
    "\"input\":{\"city\":\"Paris\",\"units\":\"C\"}}]}"
#define U2                                                                                       \
    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_01\","   \
    "\"content\":\"18C, sunny\"}]}"
#define U2_CC                                                                                    \
    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_01\","   \
    "\"content\":[{\"type\":\"text\",\"text\":\"18C, sunny\"}],"                                \
    "\"cache_control\":{\"type\":\"ephemeral\"}}]}"
#define A2 "{\"role\":\"assistant\",\"content\":\"It is 18C and sunny.\"}"
#define U3 "{\"role\":\"user\",\"content\":\"And tomorrow?\"}"

static const char turn1[] = "{\"model\":\"m\",\"max_tokens\":64," TOOLS "," SYSTEM
                            ",\"messages\":[" U1_CC "]}";
static const char turn2[] = "{\"model\":\"m\",\"max_tokens\":64," TOOLS "," SYSTEM
                            ",\"messages\":[" U1 "," A1 "," U2_CC "]}";
static const char turn3[] = "{\"model\":\"m\",\"max_tokens\":64,\"stream\":true," SYSTEM "," TOOLS
                            ",\"messages\":[" U1 "," A1 "," U2 "," A2 "," U3 "]}";

static void test_prefix_across_turns(void **state)
{
    (void)state;
    kvr_buf t1 = text_of(turn1), t2 = text_of(turn2), t3 = text_of(turn3);
    assert_true(is_prefix(&t1, &t2));
    assert_true(is_prefix(&t2, &t3));
    /* what the text holds, in the template's order: tools, system, then the messages */
    assert_true(t1.len > 4 && memcmp(t1.data, "\x1e#tool\x1fn" "add", 10) == 0);
    assert_true(contains(&t1, "\x1esystem\x1f" "cYou are a weather agent.\x1d"));
    assert_true(contains(&t1, "\x1euser\x1f" "cWeather in Paris?\x1d"));
    assert_true(contains(&t2, "\x1f" "fget_weather\x1f" "a{\"city\":\"Paris\",\"units\":\"C\"}"));
    assert_true(contains(&t2, "\x1etool\x1fitoolu_01\x1f" "c18C, sunny\x1d"));
    assert_false(contains(&t3, "toolu_01\x1f" "f")); /* tool_use ids are not rendered */
    assert_false(contains(&t3, "ephemeral"));
    /* count_tokens has the same text */
    json_t *j = parse(turn2);
    kvr_buf ct = text_of_json(j, KVR_EP_COUNT_TOKENS);
    assert_true(same(&ct, &t2));
    kvr_buf_free(&ct);
    json_decref(j);
    kvr_buf_free(&t1);
    kvr_buf_free(&t2);
    kvr_buf_free(&t3);
}

/* The same request with cache_control on every block, tool and system block, and without. */
static void test_cache_control_ignored(void **state)
{
    (void)state;
    const char *pairs[][2] = {
        {"{\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"a\"},{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":"
         "\"image/png\",\"data\":\"AAAA\"}}]}]}",
         "{\"system\":[{\"type\":\"text\",\"text\":\"s\",\"cache_control\":{\"type\":"
         "\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}},{\"type\":"
         "\"image\",\"cache_control\":{\"type\":\"ephemeral\"},\"source\":{\"type\":\"base64\","
         "\"media_type\":\"image/png\",\"data\":\"AAAA\"}}]}]}"},
        {"{\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\",\"max_uses\":5}],"
         "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"search_result\",\"source\":"
         "\"u\",\"title\":\"t\",\"content\":[]}]}]}",
         "{\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\",\"max_uses\":5,"
         "\"cache_control\":{\"type\":\"ephemeral\"}}],\"messages\":[{\"role\":\"user\","
         "\"content\":[{\"type\":\"search_result\",\"source\":\"u\",\"title\":\"t\",\"content\":[],"
         "\"cache_control\":{\"type\":\"ephemeral\"}}]}]}"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"i\","
         "\"name\":\"f\",\"input\":{\"b\":1,\"a\":2}}]}]}",
         "{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"j\","
         "\"name\":\"f\",\"input\":{\"a\":2,\"b\":1},\"cache_control\":{\"type\":"
         "\"ephemeral\"}}]}]}"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(*pairs); i++) {
        kvr_buf a = text_of(pairs[i][0]), b = text_of(pairs[i][1]);
        assert_true(a.len > 0);
        assert_true(same(&a, &b));
        kvr_buf_free(&a);
        kvr_buf_free(&b);
    }
}

static void test_tools_sorted_by_name(void **state)
{
    (void)state;
    kvr_buf ab = text_of("{\"tools\":[{\"name\":\"alpha\",\"input_schema\":{}},{\"name\":\"beta\","
                         "\"description\":\"d\",\"input_schema\":{\"y\":1,\"x\":2}}],"
                         "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    kvr_buf ba = text_of("{\"tools\":[{\"name\":\"beta\",\"description\":\"d\",\"input_schema\":"
                         "{\"x\":2,\"y\":1}},{\"name\":\"alpha\",\"input_schema\":{}}],"
                         "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    assert_true(same(&ab, &ba));
    /* name, description, canonical input_schema */
    assert_true(contains(&ab, "\x1e#tool\x1fnalpha\x1fp{}\x1d\x1e#tool\x1fnbeta\x1f"
                              "dd\x1fp{\"x\":2,\"y\":1}\x1d"));
    kvr_buf other = text_of("{\"tools\":[{\"name\":\"beta\",\"description\":\"d\",\"input_schema\":"
                            "{\"x\":3}},{\"name\":\"alpha\",\"input_schema\":{}}],"
                            "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    assert_false(same(&ab, &other));
    kvr_buf_free(&ab);
    kvr_buf_free(&ba);
    kvr_buf_free(&other);
}

static void test_block_kinds(void **state)
{
    (void)state;
    /* a string content and a single text block are the same; so are a string system and
     * one text block; empty system counts as none */
    kvr_buf a = text_of("{\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    kvr_buf b = text_of("{\"system\":[{\"type\":\"text\",\"text\":\"S\"}],\"messages\":[{\"role\":"
                        "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]}");
    assert_true(same(&a, &b));
    kvr_buf_free(&b);
    b = text_of("{\"system\":\"\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    kvr_buf c = text_of("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_true(same(&b, &c));
    assert_false(same(&a, &c));
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    kvr_buf_free(&c);
    /* images and documents count by their source only */
    const char *img = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
                      "\"source\":{\"type\":\"url\",\"url\":\"https://x/%s.png\"}%s}]}]}";
    char b1[300], b2[300], b3[300];
    snprintf(b1, sizeof(b1), img, "1", "");
    snprintf(b2, sizeof(b2), img, "1", ",\"title\":\"ignored\"");
    snprintf(b3, sizeof(b3), img, "2", "");
    a = text_of(b1), b = text_of(b2), c = text_of(b3);
    assert_true(same(&a, &b));
    assert_false(same(&a, &c));
    assert_true(contains(&a, "\x1euser\x1fx"));
    assert_false(contains(&a, "https://"));
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    kvr_buf_free(&c);
    /* thinking by its text (not its signature); tool_result blocks */
    a = text_of("{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\","
                "\"thinking\":\"ponder\",\"signature\":\"sig1\"},{\"type\":\"text\","
                "\"text\":\"x\"}]}]}");
    b = text_of("{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\","
                "\"thinking\":\"ponder\",\"signature\":\"sig2\"},{\"type\":\"text\","
                "\"text\":\"x\"}]}]}");
    assert_true(same(&a, &b));
    assert_true(contains(&a, "\x1e" "assistant\x1f" "cponder\x1f" "cx\x1d"));
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    a = text_of("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"text\","
                "\"text\":\"r\"},{\"type\":\"image\",\"source\":{\"data\":\"Z\"}}]},"
                "{\"type\":\"text\",\"text\":\"b\"}]}]}");
    assert_true(contains(&a, "\x1euser\x1f" "ca\x1d\x1etool\x1fit1\x1f" "cr\x1fx"));
    assert_true(a.len > 6 && memcmp(a.data + a.len - 9, "\x1euser\x1f" "cb\x1d", 9) == 0);
    kvr_buf_free(&a);
}

/* Turn 1's text + the reply (as the usage reader hands it over) is the head of turn 2's text,
 * however the client spells the assistant message it sends back. */
static void test_reply_taught_as_next_turn_frames_it(void **state)
{
    (void)state;
    json_t *reply = parse("{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
                          "\"Let me check.\"},{\"type\":\"tool_use\",\"name\":\"get_weather\","
                          "\"input\":{\"units\":\"C\",\"city\":\"Paris\"}}]}");
    json_t *j1 = parse(turn1);
    kvr_buf b = text_of_json(j1, KVR_ROUTE_MESSAGES);
    assert_int_equal(kvr_route_text_append_reply(&b, KVR_ROUTE_MESSAGES, reply), 1);
    kvr_buf t2 = text_of(turn2);
    assert_true(is_prefix(&b, &t2));
    assert_true(t2.len - b.len > 10); /* the tool_result follows */
    kvr_buf_free(&b);
    kvr_buf_free(&t2);
    json_decref(j1);
    json_decref(reply);
}

static void test_cap_and_malformed(void **state)
{
    (void)state;
    kvr_buf full = text_of(turn3);
    json_t *j = parse(turn3);
    for (size_t cap = 1; cap < full.len; cap += 13) {
        kvr_buf c;
        kvr_buf_init(&c, cap);
        assert_int_equal(kvr_route_text_build(j, KVR_ROUTE_MESSAGES, &c), 1);
        assert_int_equal(c.len, cap);
        assert_memory_equal(c.data, full.data, cap);
        kvr_buf_free(&c);
    }
    json_decref(j);
    kvr_buf_free(&full);
    const char *bad[] = {
        "{}", "[]", "{\"messages\":5}", "{\"messages\":[1,null,\"x\",[]]}",
        "{\"system\":7,\"tools\":{},\"messages\":[{\"content\":[7,{\"type\":3},{\"type\":"
        "\"tool_use\"},{\"type\":\"tool_result\",\"content\":9},{\"type\":\"image\"},"
        "{\"type\":\"text\",\"text\":[]},{\"type\":\"thinking\"}]}]}",
        "{\"tools\":[1,{\"name\":5},{\"input_schema\":null}],\"messages\":[{\"role\":{},"
        "\"content\":{\"a\":1}},{\"role\":\"user\",\"content\":null}]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        json_t *b = parse(bad[i]);
        kvr_buf t;
        kvr_buf_init(&t, 0);
        assert_true(kvr_route_text_build(b, KVR_ROUTE_MESSAGES, &t) >= 0);
        json_t *chat = kvr_anthropic_to_chat(b);
        assert_non_null(chat);
        assert_true(json_is_array(json_object_get(chat, "messages")));
        json_decref(chat);
        assert_true(kvr_route_text_append_reply(&t, KVR_ROUTE_MESSAGES, b) >= 0);
        kvr_buf_free(&t);
        json_decref(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_across_turns),
        cmocka_unit_test(test_cache_control_ignored),
        cmocka_unit_test(test_tools_sorted_by_name),
        cmocka_unit_test(test_block_kinds),
        cmocka_unit_test(test_reply_taught_as_next_turn_frames_it),
        cmocka_unit_test(test_cap_and_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
