/* libFuzzer harness for the Anthropic Messages routing-text extractor: the conversion of a
 * client's /v1/messages body to the chat form (src/routing/anthropic.c) and the routing text
 * built from it (src/routing/keys.c, KVR_ROUTE_MESSAGES), with Messages validation
 * (src/api/validate.c). Any JSON must never crash, leak or invoke undefined behaviour.
 *
 * Checked contracts (routing/keys.h):
 *  - the text cut at a cap is a byte prefix of the full text and says it was cut;
 *  - turns: the text of the first k messages followed by message k taught as a reply
 *    (kvr_route_text_append_reply) is exactly the text of the first k + 1 messages, so turn
 *    N's text is a byte prefix of turn N+1's;
 *  - cache_control markers never change the text: the body with `cache_control` set on every
 *    tool, system block, message content block and tool_result block gives the same text;
 *  - validation answers 0 or 400 with a message, and an accepted body has a string model. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/validate.h"
#include "routing/anthropic.h"
#include "routing/keys.h"
#include "util/json_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TEXT_CAP (32u << 20) /* kvroute's default --max-routing-text-bytes */
#define MAX_TURNS 32         /* turn checks on the first messages only: quadratic otherwise */

static kvr_buf text(const json_t *body, size_t cap, int *rc)
{
    kvr_buf b;
    kvr_buf_init(&b, cap);
    *rc = kvr_route_text_build(body, KVR_ROUTE_MESSAGES, &b);
    return b;
}

static int same(const kvr_buf *a, const kvr_buf *b)
{
    return a->len == b->len && (!a->len || memcmp(a->data, b->data, a->len) == 0);
}

static void check_cut(const json_t *body, const kvr_buf *full)
{
    if (!full->len)
        return;
    int rc;
    kvr_buf cut = text(body, full->len / 2 ? full->len / 2 : 1, &rc);
    if (rc != (full->len > cut.cap) || cut.len > cut.cap ||
        (cut.len && memcmp(cut.data, full->data, cut.len) != 0))
        __builtin_trap();
    kvr_buf_free(&cut);
}

/* text(first k messages) + reply(message k) == text(first k + 1 messages). */
static void check_turns(const json_t *body)
{
    const json_t *msgs = json_object_get(body, "messages");
    size_t n = json_array_size(msgs);
    if (n > MAX_TURNS)
        n = MAX_TURNS;
    json_t *b = json_copy((json_t *)body), *head = json_array();
    if (!b || !head || json_object_set(b, "messages", head) < 0)
        abort();
    int rc;
    kvr_buf t = text(b, TEXT_CAP, &rc);
    for (size_t k = 0; k < n; k++) {
        const json_t *m = json_array_get(msgs, k);
        int taught = kvr_route_text_append_reply(&t, KVR_ROUTE_MESSAGES, m);
        if (taught < 0 || taught != json_is_object(m))
            __builtin_trap();
        if (json_array_append(head, (json_t *)m) < 0)
            abort();
        kvr_buf next = text(b, TEXT_CAP, &rc);
        if (rc != 0)
            __builtin_trap();
        if (taught ? !same(&t, &next)
                   : (t.len > next.len || (t.len && memcmp(t.data, next.data, t.len) != 0)))
            __builtin_trap();
        kvr_buf_free(&t);
        t = next;
    }
    kvr_buf_free(&t);
    json_decref(head);
    json_decref(b);
}

static void mark(json_t *v)
{
    if (json_is_object(v) && json_object_set_new(v, "cache_control",
                                                 json_pack("{s:s}", "type", "ephemeral")) < 0)
        abort();
}

static void mark_all(json_t *list)
{
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
        mark(v);
}

static void check_cache_control(const json_t *body, const kvr_buf *full)
{
    json_t *b = json_deep_copy(body);
    if (!b)
        abort();
    mark_all(json_object_get(b, "tools"));
    mark_all(json_object_get(b, "system"));
    size_t i, k;
    json_t *m, *blk;
    json_array_foreach(json_object_get(b, "messages"), i, m) {
        json_array_foreach(json_object_get(m, "content"), k, blk) {
            mark(blk);
            const char *t = json_string_value(json_object_get(blk, "type"));
            if (t && strcmp(t, "tool_result") == 0)
                mark_all(json_object_get(blk, "content"));
        }
    }
    int rc;
    kvr_buf marked = text(b, TEXT_CAP, &rc);
    if (rc != 0 || !same(&marked, full))
        __builtin_trap();
    kvr_buf_free(&marked);
    json_decref(b);
}

static void check_validate(const json_t *body)
{
    char msg[64] = "";
    const char *param = "unset";
    int st = kvr_api_validate(body, KVR_EP_MESSAGES, msg, sizeof(msg), &param);
    if (st != 0 && (st != 400 || !msg[0] || (param && !*param)))
        __builtin_trap();
    if (st == 0 && !json_is_string(json_object_get(body, "model")))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = kvr_json_read((const char *)data, size, NULL);
    if (!body)
        return 0;
    json_t *chat = kvr_anthropic_to_chat(body);
    if (!chat || !json_is_array(json_object_get(chat, "messages")))
        __builtin_trap();
    json_decref(chat);
    int rc;
    kvr_buf full = text(body, TEXT_CAP, &rc);
    if (rc != 0)
        __builtin_trap(); /* 1 = cut (not at 32 MiB here), -1 = out of memory */
    check_validate(body);
    if (json_is_object(body)) {
        check_cut(body, &full);
        check_turns(body);
        check_cache_control(body, &full);
    }
    kvr_buf_free(&full);
    json_decref(body);
    return 0;
}
