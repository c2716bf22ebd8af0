/* The routing text from a body's scan (routing/text_scan.h) against the text from its tree
 * (routing/keys.h): same bytes, same return code, cap cuts included. Hand-written bodies
 * cover what real traffic rarely holds (escapes, odd roles, non-text parts, tool calls with
 * non-string arguments, duplicate keys); every request of the tau-bench and SWE-agent
 * traces (data/) is checked as well. Also the json_scan iterator the builder walks with. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "routing/fields.h"
#include "routing/keys.h"
#include "routing/text_scan.h"
#include "util/json_read.h"
#include "util/json_scan.h"

static const char *data_dir(void)
{
    const char *d = getenv("KVROUTE_DATA");
    return d && *d ? d : "data";
}

static kvr_body_fields g_f;
/* How the builder finds the messages: 1 where the scan placed them (the proxy's way), 0
 * walked to, 2 the first placed and the rest walked to (a body past KVR_BODY_MESSAGES_MAX). */
static int g_placed = 1;

/* The cache's kvr_json_known, counted: messages offered to it and found. */
static kvr_json_known g_kn;
static size_t g_asked, g_known, g_guessed;
static const char *g_guess_p;
static size_t g_guess_n;

static int counted_find(void *ctx, const char *p, size_t n, kvr_json_elem *e)
{
    (void)ctx;
    int hit = g_kn.find(g_kn.ctx, p, n, e);
    if (p == g_guess_p && n == g_guess_n) {
        g_guess_p = NULL;
        g_guessed += hit;
        if (!hit)
            return 0; /* a wrong guess: the scan locates the element and asks again */
    }
    g_asked++;
    g_known += hit;
    return hit;
}

static size_t counted_guess(void *ctx, const char *p, size_t avail)
{
    (void)ctx;
    static size_t calls;
    size_t n = g_kn.guess ? g_kn.guess(g_kn.ctx, p, avail) : 0;
    /* now and then a wrong length, one byte short or long: the scan must then locate the
     * element itself and answer as without guesses */
    if (n && ++calls % 7 == 0)
        n = calls % 2 ? n - 1 : (n < avail ? n + 1 : n - 1);
    g_guess_p = n ? p : NULL;
    g_guess_n = n;
    return n;
}

/* With a cache, the body is scanned as the router does (the messages whose texts are kept
 * taken as accepted before), and that scan must give what the plain one gives. */
static void scan_body(const char *body, size_t len, kvr_text_cache *cache)
{
    static kvr_body_fields plain;
    if (kvr_body_fields_scan(&plain, body, len, NULL) < 0)
        fail_msg("the scan refused: %.*s", (int)(len > 200 ? 200 : len), body);
    if (!cache || !kvr_text_cache_known(cache, &g_kn)) {
        g_f = plain;
        return;
    }
    kvr_json_known counted = {counted_find, counted_guess, NULL, g_kn.min};
    assert_int_equal(kvr_body_fields_scan_known(&g_f, body, len, NULL, &counted), 0);
    assert_int_equal(memcmp(plain.v, g_f.v, plain.n * sizeof(plain.v[0])), 0);
    size_t na, nb;
    const kvr_json_elem *a = kvr_body_messages(&plain, &na), *b = kvr_body_messages(&g_f, &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(a[i].off, b[i].off);
        assert_int_equal(a[i].len, b[i].len);
        assert_int_equal(a[i].kind, b[i].kind);
        assert_int_equal(a[i].role, b[i].role);
    }
}

/* Both texts of `body` for `kind` at cap `cap`; asserts they are equal; returns the code. */
static int same_text(const char *body, size_t len, kvr_route_kind kind, size_t cap,
                     kvr_text_cache *cache)
{
    scan_body(body, len, cache);
    json_t *tree = kvr_json_read(body, len, NULL);
    assert_non_null(tree);
    kvr_buf a, b;
    kvr_buf_init(&a, cap);
    kvr_buf_init(&b, cap);
    size_t g_nmsgs;
    const kvr_json_elem *g_msgs = kvr_body_messages(&g_f, &g_nmsgs);
    if (!g_placed)
        g_msgs = NULL;
    else if (g_placed == 2 && g_nmsgs > 1)
        g_nmsgs = 1;
    int ra = kvr_route_text_build(tree, kind, &a);
    int rb = kind == KVR_ROUTE_COMPLETIONS
                 ? kvr_route_text_scan_prompt(body, kvr_body_field(&g_f, KVR_FIELD_PROMPT), &b)
                 : kvr_route_text_scan(body, kvr_body_field(&g_f, KVR_FIELD_TOOLS),
                                       kvr_body_field(&g_f, KVR_FIELD_FUNCTIONS),
                                       kvr_body_field(&g_f, KVR_FIELD_MESSAGES), g_msgs,
                                       g_nmsgs, cache, &b);
    assert_int_equal(ra, rb);
    assert_int_equal(a.len, b.len);
    if (a.len && memcmp(a.data, b.data, a.len) != 0)
        fail_msg("texts differ for %.*s", (int)(len > 200 ? 200 : len), body);
    kvr_buf_free(&a);
    kvr_buf_free(&b);
    json_decref(tree);
    return ra;
}

/* Uncapped, then cut at every cap up to the text's length + 1: the same text and code. */
static void check_all_caps(const char *body, kvr_route_kind kind)
{
    size_t len = strlen(body);
    assert_int_equal(same_text(body, len, kind, 0, NULL), 0);
    json_t *tree = kvr_json_read(body, len, NULL);
    kvr_buf full;
    kvr_buf_init(&full, 0);
    kvr_route_text_build(tree, kind, &full);
    json_decref(tree);
    for (size_t cap = 1; cap <= full.len + 1; cap++)
        assert_int_equal(same_text(body, len, kind, cap, NULL), cap < full.len ? 1 : 0);
    kvr_buf_free(&full);
}

static const char *const g_chat[] = {
    /* escapes and unicode, raw and escaped spellings of the same text */
    "{\"messages\":[{\"role\":\"us\\u0065r\",\"content\":\"caf\\u00e9 \\/ \\\"q\\\" "
    "\\ud83d\\ude00\\n\\t\\b\\f\\r\\\\\"},{\"role\":\"assistant\",\"content\":\"\xc3\xa9\xf0\x9f"
    "\x98\x80\"},{\"role\":\"user\",\"name\":\"b\\u00f6b\",\"content\":\"\"}]}",
    /* odd roles and odd messages */
    "{\"messages\":[{\"role\":7,\"content\":\"x\"},{\"role\":null},{\"content\":\"\"},"
    "{\"role\":{\"b\":1,\"a\":[2.5e3,true,-0.0,1E300,123456789012]}},\"str\",12,[1],null,{}]}",
    /* content parts: bare strings, text kinds, non-text parts as digests */
    "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\",\"\",{\"type\":\"text\",\"text\":"
    "\"b\"},{\"type\":\"input_text\",\"text\":\"\"},{\"type\":\"output_text\",\"text\":7},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:x\"}},{\"text\":\"t\"},3,null,"
    "{\"type\":\"t\\u0065xt\",\"text\":\"esc type\"},{\"type\":\"text \",\"text\":\"no\"}]},"
    "{\"role\":\"user\",\"content\":{\"type\":\"text\",\"text\":\"obj\"}},"
    "{\"role\":\"user\",\"content\":42},{\"role\":\"user\",\"content\":[]}]}",
    /* tool calls with non-string names and arguments, legacy function_call */
    "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\","
    "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1,\"a\":[null]}}},{\"function\":"
    "{\"arguments\":\"{}\"}},{\"function\":\"notobj\"},\"s\",{\"function\":{\"name\":5,"
    "\"arguments\":null}},{\"function\":{\"name\":\"\",\"arguments\":\"\"}}],"
    "\"function_call\":{\"name\":\"g\",\"arguments\":[1,2]}},{\"role\":\"tool\","
    "\"tool_call_id\":\"1\",\"name\":\"f\",\"content\":\"ok\"},{\"role\":\"tool\","
    "\"tool_call_id\":9,\"name\":[\"x\"],\"tool_calls\":{\"a\":1},\"function_call\":\"x\"}]}",
    /* tools with and without names, ties on a name, legacy functions, odd parameters */
    "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"b\",\"description\":\"d\","
    "\"parameters\":null}},{\"type\":\"web_search\"},{\"function\":{\"name\":\"a\","
    "\"parameters\":{\"z\":1,\"a\":2}}},{\"type\":\"function\",\"function\":{\"name\":\"a\","
    "\"description\":7}},{\"name\":\"flat\"},\"str\",{\"function\":{\"name\":\"\\u00e9\"}}],"
    "\"functions\":[{\"name\":\"legacy\",\"description\":\"l\",\"parameters\":{\"type\":"
    "\"object\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
    /* duplicate keys: the last wins, at every level */
    "{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"a\",\"content\":\"b\","
    "\"name\":\"x\",\"name\":7}],\"tools\":[],\"tools\":[{\"function\":{\"name\":\"n\","
    "\"name\":\"m\",\"parameters\":{\"k\":1,\"k\":2}}}],\"messages\":[{\"role\":\"user\","
    "\"content\":[{\"type\":\"image\",\"type\":\"text\",\"text\":1,\"text\":\"last\"}]}]}",
    /* whitespace everywhere, empty lists */
    " { \"messages\" : [ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , "
    "\"text\" : \"hi\" } ] } , { } ] , \"tools\" : [ ] , \"functions\" : [\n] } ",
    /* not arrays where lists belong */
    "{\"messages\":{\"role\":\"user\"},\"tools\":{\"function\":{\"name\":\"x\"}},"
    "\"functions\":\"f\"}",
    "{}",
};

static void test_hand_written_chat(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(g_chat) / sizeof(g_chat[0]); i++)
        check_all_caps(g_chat[i], KVR_ROUTE_CHAT);
}

static void test_completions(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "{\"prompt\":\"Once upon a time \\u00e9\\n\"}", "{\"prompt\":\"\"}", "{\"prompt\":null}",
        "{\"prompt\":[1,2,3,-4,5.5]}", "{\"prompt\":[\"a\",[1,2],{\"x\":1},\"b\"]}",
        "{\"prompt\":{\"k\":true}}", "{\"prompt\":[]}", "{\"model\":\"m\"}",
        "{\"prompt\":\"a\",\"prompt\":\"last\"}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        check_all_caps(bodies[i], KVR_ROUTE_COMPLETIONS);
}

/* The tools cache: a hit gives the text a miss built; a changed list misses; more lists
 * than entries evict the least recently used. */
static void test_tools_cache(void **state)
{
    (void)state;
    kvr_text_cache *c = kvr_text_cache_new(0, 0);
    assert_non_null(c);
    uint64_t h, m;
    char body[256];
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < KVR_TEXT_CACHE_ENTRIES; i++) {
            snprintf(body, sizeof(body),
                     "{\"tools\":[{\"function\":{\"name\":\"t%d\",\"parameters\":{\"b\":1,"
                     "\"a\":2}}}],\"messages\":[{\"role\":\"user\",\"content\":\"q%d\"}]}",
                     i, round);
            assert_int_equal(same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c), 0);
            assert_int_equal(same_text(body, strlen(body), KVR_ROUTE_CHAT, 9, c), 1);
        }
    kvr_text_cache_stats(c, &h, &m);
    assert_int_equal(m, KVR_TEXT_CACHE_ENTRIES); /* each list built once */
    assert_int_equal(h, 3 * KVR_TEXT_CACHE_ENTRIES);
    /* one more list evicts t0 (least recently used); t1 still hits */
    snprintf(body, sizeof(body), "{\"tools\":[{\"function\":{\"name\":\"new\"}}]}");
    same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c);
    snprintf(body, sizeof(body), "{\"tools\":[{\"function\":{\"name\":\"t1\",\"parameters\":"
                                 "{\"b\":1,\"a\":2}}}]}");
    same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c);
    snprintf(body, sizeof(body), "{\"tools\":[{\"function\":{\"name\":\"t0\",\"parameters\":"
                                 "{\"b\":1,\"a\":2}}}]}");
    same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c);
    kvr_text_cache_stats(c, &h, &m);
    assert_int_equal(m, KVR_TEXT_CACHE_ENTRIES + 2);
    assert_int_equal(h, 3 * KVR_TEXT_CACHE_ENTRIES + 1);
    /* the same tools moved to `functions` are another key, and another text */
    snprintf(body, sizeof(body), "{\"functions\":[{\"name\":\"t1\",\"parameters\":"
                                 "{\"b\":1,\"a\":2}}]}");
    same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c);
    kvr_text_cache_stats(c, &h, &m);
    assert_int_equal(m, KVR_TEXT_CACHE_ENTRIES + 3);
    kvr_text_cache_free(c);
    kvr_text_cache_free(NULL);
}

/* The message texts kept: a later turn finds the earlier turns' texts (same text as the
 * tree's), a cut text is not kept, the budget holds, and a zero budget keeps nothing. */
static void test_message_memo(void **state)
{
    (void)state;
    kvr_text_cache *c = kvr_text_cache_new(4096, 16);
    assert_non_null(c);
    uint64_t h, m;
    size_t bytes;
    const char *t1 = "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful "
                     "agent.\\nBe brief.\"},{\"role\":\"user\",\"content\":\"book a flight\"}]}";
    const char *t2 = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You "
                     "are a helpful agent.\\nBe brief.\"},{\"role\":\"user\",\"content\":\"book a "
                     "flight\"},{\"role\":\"assistant\",\"content\":\"Where to?\"},{\"role\":"
                     "\"user\",\"content\":\"Paris\"}]}";
    /* cut inside the first message: nothing kept */
    assert_int_equal(same_text(t1, strlen(t1), KVR_ROUTE_CHAT, 10, c), 1);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, 0);
    assert_int_equal(m, 1);
    assert_int_equal(bytes, 0);
    assert_int_equal(same_text(t1, strlen(t1), KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, 0);
    assert_int_equal(m, 3);
    assert_true(bytes > 0);
    /* the next turn: the two messages found, the two new ones built */
    assert_int_equal(same_text(t2, strlen(t2), KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, 2);
    assert_int_equal(m, 5);
    /* a kept text is cut like a built one */
    for (size_t cap = 1; cap < 80; cap += 7)
        same_text(t2, strlen(t2), KVR_ROUTE_CHAT, cap, c);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_true(h > 2);
    /* many distinct messages: the budget holds, the oldest go */
    char body[512];
    for (int i = 0; i < 200; i++) {
        snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"message "
                                     "number %d, long enough to be kept by the cache here\"}]}", i);
        same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c);
        kvr_text_cache_memo_stats(c, &h, &m, &bytes);
        assert_true(bytes <= 4096);
    }
    uint64_t h0 = h;
    same_text(t1, strlen(t1), KVR_ROUTE_CHAT, 0, c); /* evicted long ago */
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, h0);
    same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c); /* the last one is still there */
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, h0 + 1);
    kvr_text_cache_free(c);
    /* no budget: nothing kept, nothing counted */
    c = kvr_text_cache_new(0, 16);
    same_text(t2, strlen(t2), KVR_ROUTE_CHAT, 0, c);
    same_text(t2, strlen(t2), KVR_ROUTE_CHAT, 0, c);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h + m + bytes, 0);
    kvr_text_cache_free(c);
}

/* A message the scan found, whose kept text the same request's new messages push out of the
 * budget before its own text is built: it is built again from its bytes (the scan's hit is
 * not used once anything was dropped; under ASan or valgrind a stale one would be a read of
 * freed memory), and the text is the tree's. */
static void test_message_memo_evicted_between_scan_and_build(void **state)
{
    (void)state;
    kvr_text_cache *c = kvr_text_cache_new(4096, 16);
    assert_non_null(c);
    const char *a = "{\"role\":\"user\",\"content\":\"the message kept first, then pushed out "
                    "by the ones before it in the next body\"}";
    char body[8192];
    snprintf(body, sizeof(body), "{\"messages\":[%s]}", a);
    assert_int_equal(same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c), 0);
    size_t n = (size_t)snprintf(body, sizeof(body), "{\"messages\":[");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(body + n, sizeof(body) - n,
                              "{\"role\":\"user\",\"content\":\"new message %d, long enough "
                              "to be kept, and there are many\"},", i);
    snprintf(body + n, sizeof(body) - n, "%s]}", a);
    uint64_t h0, m0, h, m;
    size_t bytes;
    kvr_text_cache_memo_stats(c, &h0, &m0, &bytes);
    g_known = 0;
    assert_int_equal(same_text(body, strlen(body), KVR_ROUTE_CHAT, 0, c), 0);
    assert_int_equal(g_known, 1); /* the scan did find it */
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, h0);          /* no text taken from the cache */
    assert_int_equal(m, m0 + 41);     /* all built, the found one too */
    assert_true(bytes <= 4096);
    kvr_text_cache_free(c);
}

/* A route that reads no routing text keeps the messages it accepted without their texts
 * (kvr_text_cache_accept): the next scan of the same bytes takes them as known, and a
 * text-reading route that meets them later builds their texts (the tree's) and keeps them. */
static void test_message_memo_accepted_without_text(void **state)
{
    (void)state;
    kvr_text_cache *c = kvr_text_cache_new(1u << 16, 16);
    assert_non_null(c);
    const char *t2 = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You "
                     "are a helpful agent.\\nBe brief.\"},{\"role\":\"user\",\"content\":\"book a "
                     "flight\"},{\"role\":\"assistant\",\"content\":\"Where to?\"},{\"role\":"
                     "\"user\",\"content\":\"Paris\"},\"not an object\"]}";
    size_t len = strlen(t2), n;
    uint64_t h, m;
    size_t bytes;
    /* first seen: hashed, not found, accepted */
    g_known = 0;
    scan_body(t2, len, c);
    assert_int_equal(g_known, 0);
    const kvr_json_elem *el = kvr_body_messages(&g_f, &n);
    assert_int_equal(n, 5);
    kvr_text_cache_accept(c, t2, el, n);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h + m, 0); /* no text built or taken */
    assert_true(bytes > 0 && bytes < 4 * 128);
    size_t kept = bytes;
    /* the same bytes again: the four objects known (the string is never offered) */
    scan_body(t2, len, c);
    assert_int_equal(g_known, 4);
    kvr_text_cache_accept(c, t2, kvr_body_messages(&g_f, &n), n);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(bytes, kept); /* nothing added twice */
    /* a text-reading route: texts built (as the tree's), kept with them */
    assert_int_equal(same_text(t2, len, KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, 0);
    assert_int_equal(m, 4);
    assert_true(bytes > kept);
    assert_int_equal(same_text(t2, len, KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, 4);
    assert_int_equal(m, 4);
    /* no budget: accept keeps nothing */
    kvr_text_cache_free(c);
    c = kvr_text_cache_new(0, 16);
    scan_body(t2, len, c);
    kvr_text_cache_accept(c, t2, kvr_body_messages(&g_f, &n), n);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h + m + bytes, 0);
    kvr_text_cache_accept(NULL, t2, kvr_body_messages(&g_f, &n), n);
    kvr_text_cache_free(c);
}

/* Messages under the 128 bytes the start-of-message guess needs are found without being
 * located when the message before them was found: the length of the element that followed
 * it last time is tried when its last bytes match. Another conversation sharing the first
 * message but not the second gets its own texts (a wrong guess is only a miss). */
static void test_message_memo_guesses_the_next_message(void **state)
{
    (void)state;
    kvr_text_cache *c = kvr_text_cache_new(1u << 16, 16);
    assert_non_null(c);
    const char *a = "{\"messages\":[{\"role\":\"system\",\"content\":\"short rules, under 128 bytes "
                    "as written\"},{\"role\":\"user\",\"content\":\"first question of this "
                    "conversation\"}, {\"role\":\"assistant\",\"content\":\"its first answer, "
                    "short\"}]}";
    const char *b = "{\"messages\":[{\"role\":\"system\",\"content\":\"short rules, under 128 bytes "
                    "as written\"},{\"role\":\"user\",\"content\":\"a question of another "
                    "conversation\"},{\"role\":\"assistant\",\"content\":\"another answer\"}]}";
    g_guessed = 0;
    for (int round = 0; round < 2; round++) /* kept, then found and their order learnt */
        assert_int_equal(same_text(a, strlen(a), KVR_ROUTE_CHAT, 0, c), 0);
    assert_int_equal(g_guessed, 0); /* all under 128 bytes: nothing to guess from yet */
    size_t before = g_guessed;
    for (int round = 0; round < 3; round++)
        assert_int_equal(same_text(a, strlen(a), KVR_ROUTE_CHAT, 0, c), 0);
    assert_true(g_guessed - before >= 4); /* the 2nd and 3rd each time, bar a spoilt guess */
    uint64_t h0, m0, h, m;
    size_t bytes;
    kvr_text_cache_memo_stats(c, &h0, &m0, &bytes);
    assert_int_equal(same_text(b, strlen(b), KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_memo_stats(c, &h, &m, &bytes);
    assert_int_equal(h, h0 + 1); /* the shared system message */
    assert_int_equal(m, m0 + 2);
    assert_int_equal(same_text(a, strlen(a), KVR_ROUTE_CHAT, 0, c), 0);
    kvr_text_cache_free(c);
}

/* Every request of a trace: each conversation cut after every assistant turn, as one chat
 * body (ensure_ascii spelling from jansson, so escapes too), with and without tools. */
static void trace_check(const char *path, size_t *requests)
{
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("missing %s (set KVROUTE_DATA)", path);
    /* keeps message texts: each request resends the turns before it (cut ones included) */
    kvr_text_cache *cache = kvr_text_cache_new(1u << 20, KVR_TEXT_MEMO_MIN);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"think\","
                               "\"description\":\"Think.\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"thought\":{\"type\":\"string\"}}}}}]",
                               0, NULL);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        json_t *msgs = json_object_get(j, "messages");
        for (size_t n = 1; n <= json_array_size(msgs); n++) {
            const char *role = json_string_value(json_object_get(json_array_get(msgs, n - 1),
                                                                 "role"));
            if (n < json_array_size(msgs) && (!role || strcmp(role, "assistant") != 0))
                continue;
            json_t *body = json_pack("{s:s,s:o}", "model", "m", "messages",
                                     json_array());
            for (size_t k = 0; k < n; k++)
                json_array_append(json_object_get(body, "messages"), json_array_get(msgs, k));
            if (n % 2)
                json_object_set(body, "tools", tools);
            char *s = json_dumps(body, n % 3 ? JSON_COMPACT : JSON_ENSURE_ASCII);
            assert_int_equal(same_text(s, strlen(s), KVR_ROUTE_CHAT, 0, cache), 0);
            g_placed = 0;
            same_text(s, strlen(s), KVR_ROUTE_CHAT, strlen(s) / 3, NULL);
            g_placed = 2;
            same_text(s, strlen(s), KVR_ROUTE_CHAT, strlen(s) / 3, cache);
            g_placed = 1;
            (*requests)++;
            free(s);
            json_decref(body);
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    json_decref(tools);
    uint64_t h, m;
    size_t bytes;
    kvr_text_cache_memo_stats(cache, &h, &m, &bytes);
    assert_true(h > 2 * m); /* most messages were sent again by a later turn */
    /* and the scan took most of them as accepted before, without validating them again */
    print_message("scan: %zu of %zu long messages known\n", g_known, g_asked);
    assert_true(g_known > 2 * (g_asked - g_known));
    /* and found most of those by the guessed length, without locating them first */
    print_message("scan: %zu of them by the guessed length\n", g_guessed);
    assert_true(g_guessed > 2 * (g_known - g_guessed));
    assert_true(bytes > 0 && bytes <= 1u << 20);
    kvr_text_cache_free(cache);
}

static void test_traces(void **state)
{
    (void)state;
    char path[512];
    size_t n = 0;
    snprintf(path, sizeof(path), "%s/tau-bench-airline-gpt4o/trajectories.jsonl", data_dir());
    trace_check(path, &n);
    snprintf(path, sizeof(path), "%s/swe-agent-trajectories/trajectories.jsonl", data_dir());
    trace_check(path, &n);
    assert_true(n > 2000);
    print_message("%zu trace requests: scan text == tree text\n", n);
}

/* The iterator: elements and members in order with their kinds and spans, duplicates as
 * written, names compared decoded. */
static void test_iter(void **state)
{
    (void)state;
    const char *b = "{\"a\" : [1, -2.5e1 ,\"s\\n\", true,false,null,{},[ ]] ,\"\\u0062\":{\"x\":"
                    "1,\"x\":2}}";
    kvr_json_span top = {.off = 0, .len = strlen(b), .kind = KVR_JSON_OBJECT};
    assert_int_equal(kvr_json_scan(b, strlen(b), NULL, 0, NULL), KVR_JSON_OBJECT);
    kvr_json_iter it;
    kvr_json_span k, v, e;
    assert_int_equal(kvr_json_iter_init(&it, b, &top), 1);
    assert_int_equal(kvr_json_iter_next(&it, &k, &v), 1);
    assert_true(kvr_json_span_is(b, &k, "a"));
    assert_int_equal(v.kind, KVR_JSON_ARRAY);
    static const kvr_json_kind kinds[] = {KVR_JSON_INTEGER, KVR_JSON_REAL, KVR_JSON_STRING,
                                          KVR_JSON_TRUE, KVR_JSON_FALSE, KVR_JSON_NULL,
                                          KVR_JSON_OBJECT, KVR_JSON_ARRAY};
    static const char *const texts[] = {"1", "-2.5e1", "\"s\\n\"", "true", "false", "null",
                                        "{}", "[ ]"};
    kvr_json_iter in;
    kvr_json_iter_init(&in, b, &v);
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(kvr_json_iter_next(&in, NULL, &e), 1);
        assert_int_equal(e.kind, kinds[i]);
        assert_int_equal(e.len, strlen(texts[i]));
        assert_memory_equal(b + e.off, texts[i], e.len);
    }
    assert_int_equal(kvr_json_iter_next(&in, NULL, &e), 0);
    assert_int_equal(kvr_json_iter_next(&in, NULL, &e), 0);
    assert_int_equal(kvr_json_iter_next(&it, &k, &v), 1);
    assert_true(kvr_json_span_is(b, &k, "b"));
    assert_false(kvr_json_span_is(b, &k, "bb"));
    const char *names[] = {"x", "y"};
    kvr_json_span m[2];
    assert_int_equal(kvr_json_span_members(b, &v, names, 2, m), 1);
    assert_int_equal(m[0].ival, 2); /* the last "x" */
    assert_int_equal(m[1].kind, KVR_JSON_ABSENT);
    assert_int_equal(kvr_json_iter_next(&it, &k, &v), 0);
    kvr_json_span s = {.kind = KVR_JSON_STRING};
    assert_int_equal(kvr_json_iter_init(&it, b, &s), 0);
    assert_int_equal(kvr_json_iter_next(&it, &k, &v), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iter),
        cmocka_unit_test(test_hand_written_chat),
        cmocka_unit_test(test_completions),
        cmocka_unit_test(test_tools_cache),
        cmocka_unit_test(test_message_memo),
        cmocka_unit_test(test_message_memo_evicted_between_scan_and_build),
        cmocka_unit_test(test_message_memo_accepted_without_text),
        cmocka_unit_test(test_message_memo_guesses_the_next_message),
        cmocka_unit_test(test_traces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
