/* Anthropic Messages → OpenAI chat form. See anthropic.h for the mapping. */
#include "routing/anthropic.h"

#include <string.h>

/* Setters that always consume `v` (jansson's _new variants do, even on failure, and accept
 * a NULL container) and record a failure in `*ok`, so a conversion checks memory once. */
static void set_new(json_t *o, const char *k, json_t *v, int *ok)
{
    if (!v || json_object_set_new(o, k, v) < 0)
        *ok = 0;
}

static void set_ref(json_t *o, const char *k, const json_t *v, int *ok)
{
    if (v)
        set_new(o, k, json_incref((json_t *)v), ok);
}

static void push_new(json_t *a, json_t *v, int *ok)
{
    if (!v || json_array_append_new(a, v) < 0)
        *ok = 0;
}

static int type_is(const json_t *block, const char *type)
{
    const char *t = json_string_value(json_object_get(block, "type"));
    return t && strcmp(t, type) == 0;
}

/* The value without its cache_control member (a shallow copy only when it has one). */
static json_t *without_cache_control(const json_t *v)
{
    if (!json_is_object(v) || !json_object_get(v, "cache_control"))
        return json_incref((json_t *)v);
    json_t *c = json_copy((json_t *)v);
    if (c)
        json_object_del(c, "cache_control");
    return c;
}

static json_t *text_part(const json_t *text, int *ok)
{
    json_t *p = json_object();
    set_new(p, "type", json_string("text"), ok);
    set_ref(p, "text", text, ok);
    return p;
}

/* One content block as a chat part (tool_use and tool_result are the caller's). */
static json_t *part(const json_t *b, int *ok)
{
    const json_t *text = json_object_get(b, "text");
    if (type_is(b, "text") && json_is_string(text))
        return text_part(text, ok);
    const json_t *thinking = json_object_get(b, "thinking");
    if (type_is(b, "thinking") && json_is_string(thinking))
        return text_part(thinking, ok);
    if (type_is(b, "image") || type_is(b, "document")) {
        json_t *p = json_object();
        set_ref(p, "type", json_object_get(b, "type"), ok);
        set_ref(p, "source", json_object_get(b, "source"), ok);
        return p;
    }
    return without_cache_control(b);
}

/* A block list (or a string, or anything else) as chat content. */
static json_t *content(const json_t *c, int *ok)
{
    if (!json_is_array(c))
        return json_incref((json_t *)c);
    json_t *parts = json_array();
    size_t i;
    const json_t *b;
    json_array_foreach(c, i, b)
        push_new(parts, part(b, ok), ok);
    return parts;
}

static json_t *tool(const json_t *t, int *ok)
{
    if (!json_is_object(t))
        return json_incref((json_t *)t);
    json_t *out = json_object(), *fn = json_object();
    set_new(out, "type", json_string("function"), ok);
    set_ref(fn, "name", json_object_get(t, "name"), ok);
    set_ref(fn, "description", json_object_get(t, "description"), ok);
    const json_t *schema = json_object_get(t, "input_schema");
    set_new(fn, "parameters", schema ? json_incref((json_t *)schema) : without_cache_control(t),
            ok);
    set_new(out, "function", fn, ok);
    return out;
}

/* The message being assembled from an Anthropic message's blocks. */
typedef struct conv {
    json_t *out;          /* chat messages */
    const json_t *role;
    json_t *parts, *calls; /* NULL until the first part / tool call */
    int emitted;          /* a message was appended for this Anthropic message */
    int ok;
} conv;

static json_t *message_head(const json_t *role, int *ok)
{
    json_t *m = json_object();
    set_ref(m, "role", role, ok);
    return m;
}

static void flush(conv *c)
{
    if (!c->parts && !c->calls)
        return;
    json_t *m = message_head(c->role, &c->ok);
    if (c->parts)
        set_new(m, "content", c->parts, &c->ok);
    if (c->calls)
        set_new(m, "tool_calls", c->calls, &c->ok);
    c->parts = c->calls = NULL;
    push_new(c->out, m, &c->ok);
    c->emitted = 1;
}

static void tool_use(conv *c, const json_t *b)
{
    json_t *call = json_object(), *fn = json_object();
    set_new(call, "type", json_string("function"), &c->ok);
    set_ref(fn, "name", json_object_get(b, "name"), &c->ok);
    set_ref(fn, "arguments", json_object_get(b, "input"), &c->ok);
    set_new(call, "function", fn, &c->ok);
    if (!c->calls)
        c->calls = json_array();
    push_new(c->calls, call, &c->ok);
}

static void tool_result(conv *c, const json_t *b)
{
    flush(c);
    json_t *m = json_object();
    set_new(m, "role", json_string("tool"), &c->ok);
    set_ref(m, "tool_call_id", json_object_get(b, "tool_use_id"), &c->ok);
    const json_t *body = json_object_get(b, "content");
    if (body)
        set_new(m, "content", content(body, &c->ok), &c->ok);
    push_new(c->out, m, &c->ok);
    c->emitted = 1;
}

int kvr_anthropic_message_to_chat(const json_t *m, json_t *out)
{
    int ok = 1;
    if (!json_is_object(m)) {
        push_new(out, json_incref((json_t *)m), &ok);
        return ok ? 0 : -1;
    }
    conv c = {.out = out, .role = json_object_get(m, "role"), .ok = 1};
    const json_t *blocks = json_object_get(m, "content");
    if (!json_is_array(blocks)) {
        json_t *msg = message_head(c.role, &c.ok);
        if (blocks && !json_is_null(blocks))
            set_ref(msg, "content", blocks, &c.ok);
        push_new(out, msg, &c.ok);
        return c.ok ? 0 : -1;
    }
    size_t i;
    const json_t *b;
    json_array_foreach(blocks, i, b) {
        if (type_is(b, "tool_use")) {
            tool_use(&c, b);
        } else if (type_is(b, "tool_result")) {
            tool_result(&c, b);
        } else {
            if (!c.parts)
                c.parts = json_array();
            push_new(c.parts, part(b, &c.ok), &c.ok);
        }
    }
    flush(&c);
    if (!c.emitted)
        push_new(out, message_head(c.role, &c.ok), &c.ok);
    return c.ok ? 0 : -1;
}

/* `system`: a string or text blocks, as the first message. */
static void system_message(const json_t *sys, json_t *msgs, int *ok)
{
    if (!sys || json_is_null(sys) || (json_is_string(sys) && !json_string_length(sys)) ||
        (json_is_array(sys) && !json_array_size(sys)))
        return;
    json_t *m = json_object();
    set_new(m, "role", json_string("system"), ok);
    set_new(m, "content", content(sys, ok), ok);
    push_new(msgs, m, ok);
}

json_t *kvr_anthropic_to_chat(const json_t *body)
{
    int ok = 1;
    json_t *out = json_object(), *msgs = json_array();
    if (!out || !msgs || json_object_set_new(out, "messages", msgs) < 0) {
        json_decref(out); /* a failed set consumed msgs */
        if (!out)
            json_decref(msgs);
        return NULL;
    }
    const json_t *tools = json_object_get(body, "tools");
    if (json_array_size(tools)) {
        json_t *list = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t)
            push_new(list, tool(t, &ok), &ok);
        set_new(out, "tools", list, &ok);
    } else if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        set_ref(out, "tools", tools, &ok);
    }
    system_message(json_object_get(body, "system"), msgs, &ok);
    size_t i;
    const json_t *m;
    json_array_foreach(json_object_get(body, "messages"), i, m) {
        if (kvr_anthropic_message_to_chat(m, msgs) < 0)
            ok = 0;
    }
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}
