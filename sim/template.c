/* Llama-3.1-style chat template rendered straight into token ids. */
#include "template.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void text(kvr_sim_toks *out, const char *s, size_t n)
{
    kvr_sim_tokenize(out, s, n);
}

static void text_z(kvr_sim_toks *out, const char *s)
{
    kvr_sim_tokenize(out, s, strlen(s));
}

static void header(kvr_sim_toks *out, const char *role, size_t role_len, const char *name,
                   size_t name_len)
{
    kvr_sim_toks_push(out, KVR_SIM_TOK_START_HEADER);
    text(out, role, role_len);
    if (name) {
        text(out, ":", 1);
        text(out, name, name_len);
    }
    kvr_sim_toks_push(out, KVR_SIM_TOK_END_HEADER);
    text(out, "\n\n", 2);
}

/* Writes JSON text of `v` as tokens (compact, keys in the order given, like Jinja's tojson
 * without sort). Returns -1 on OOM. */
static int json_text(kvr_sim_toks *out, const json_t *v, size_t flags)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | flags);
    if (!s)
        return -1;
    text_z(out, s);
    free(s);
    return 0;
}

static int media(kvr_sim_toks *out, const json_t *part)
{
    char *s = json_dumps(part, JSON_COMPACT | JSON_SORT_KEYS);
    if (!s)
        return -1;
    XXH128_hash_t h = XXH3_128bits(s, strlen(s));
    free(s);
    kvr_sim_toks_push(out, KVR_SIM_TOK_MEDIA);
    for (int i = 0; i < 4; i++) {
        kvr_sim_toks_push(out, (uint32_t)((h.low64 >> (16 * i)) & 0xffff));
        kvr_sim_toks_push(out, (uint32_t)((h.high64 >> (16 * i)) & 0xffff));
    }
    return 0;
}

#define FAIL(msg, p)                                                                               \
    do {                                                                                           \
        *err = (msg);                                                                              \
        if (param)                                                                                 \
            *param = (p);                                                                          \
        return -1;                                                                                 \
    } while (0)

static int content(kvr_sim_toks *out, const json_t *c, const char **err, const char **param)
{
    if (!c || json_is_null(c))
        return 0;
    if (json_is_string(c)) {
        text(out, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        FAIL("message content must be a string, an array of content parts or null", "messages");
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        const json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            FAIL("each content part must be an object with a string 'type'", "messages");
        if (strcmp(json_string_value(type), "text") == 0) {
            const json_t *t = json_object_get(part, "text");
            if (!json_is_string(t))
                FAIL("a text content part needs a string 'text'", "messages");
            text(out, json_string_value(t), json_string_length(t));
        } else if (media(out, part) < 0) {
            FAIL("out of memory", NULL);
        }
    }
    return 0;
}

static int tool_calls(kvr_sim_toks *out, const json_t *calls, const char **err,
                      const char **param)
{
    if (!calls || json_is_null(calls))
        return 0;
    if (!json_is_array(calls))
        FAIL("tool_calls must be an array", "messages");
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        const json_t *fn = json_object_get(call, "function");
        if (!json_is_object(call) || !json_is_object(fn))
            FAIL("each tool call needs a 'function' object", "messages");
        const json_t *name = json_object_get(fn, "name");
        const json_t *args = json_object_get(fn, "arguments");
        kvr_sim_toks_push(out, KVR_SIM_TOK_PYTHON_TAG);
        if (json_is_string(name))
            text(out, json_string_value(name), json_string_length(name));
        if (json_is_string(args))
            text(out, json_string_value(args), json_string_length(args));
        else if (args && json_text(out, args, 0) < 0)
            FAIL("out of memory", NULL);
        kvr_sim_toks_push(out, KVR_SIM_TOK_EOM);
    }
    return 0;
}

int kvr_sim_render_chat_head(kvr_sim_toks *out, const json_t *tools, const char **err,
                             const char **param)
{
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        FAIL("'tools' must be an array", "tools");
    kvr_sim_toks_push(out, KVR_SIM_TOK_BOS);
    if (json_array_size(tools) == 0)
        return 0;
    header(out, "system", 6, NULL, 0);
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        if (!json_is_object(tool))
            FAIL("each tool must be an object", "tools");
        if (json_text(out, tool, 0) < 0)
            FAIL("out of memory", NULL);
        text(out, "\n", 1);
    }
    kvr_sim_toks_push(out, KVR_SIM_TOK_EOT);
    return 0;
}

static int message(kvr_sim_toks *out, const json_t *m, const char **err, const char **param)
{
    if (!json_is_object(m))
        FAIL("each message must be an object", "messages");
    const json_t *role = json_object_get(m, "role");
    if (!json_is_string(role))
        FAIL("each message needs a string 'role'", "messages");
    const json_t *name = json_object_get(m, "name");
    if (name && !json_is_string(name))
        name = NULL;
    header(out, json_string_value(role), json_string_length(role),
           name ? json_string_value(name) : NULL, name ? json_string_length(name) : 0);
    if (content(out, json_object_get(m, "content"), err, param) < 0)
        return -1;
    if (tool_calls(out, json_object_get(m, "tool_calls"), err, param) < 0)
        return -1;
    const json_t *tcid = json_object_get(m, "tool_call_id");
    if (json_is_string(tcid)) {
        text(out, "\n[", 2);
        text(out, json_string_value(tcid), json_string_length(tcid));
        text(out, "]", 1);
    }
    kvr_sim_toks_push(out, KVR_SIM_TOK_EOT);
    return 0;
}

int kvr_sim_render_messages(kvr_sim_toks *out, const json_t *messages, const char **err,
                            const char **param)
{
    if (!json_is_array(messages))
        FAIL("'messages' must be an array", "messages");
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        if (message(out, m, err, param) < 0)
            return -1;
    }
    return 0;
}

void kvr_sim_render_gen_prompt(kvr_sim_toks *out)
{
    header(out, "assistant", 9, NULL, 0);
}

int kvr_sim_render_chat(kvr_sim_toks *out, const json_t *messages, const json_t *tools,
                        int add_generation_prompt, const char **err, const char **param)
{
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        FAIL("'messages' must be a non-empty array", "messages");
    if (kvr_sim_render_chat_head(out, tools, err, param) < 0 ||
        kvr_sim_render_messages(out, messages, err, param) < 0)
        return -1;
    if (add_generation_prompt)
        kvr_sim_render_gen_prompt(out);
    return 0;
}

static int token_array(kvr_sim_toks *out, const json_t *a, const char **err)
{
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v)) {
            *err = "a token-id prompt must contain only integers";
            return -1;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= (json_int_t)KVR_SIM_VOCAB) {
            *err = "token id out of vocabulary";
            return -1;
        }
        kvr_sim_toks_push(out, (uint32_t)id);
    }
    return 0;
}

int kvr_sim_render_completion(kvr_sim_toks *out, const json_t *prompt, const char **err)
{
    if (json_is_string(prompt)) {
        kvr_sim_toks_push(out, KVR_SIM_TOK_BOS);
        text(out, json_string_value(prompt), json_string_length(prompt));
        return 0;
    }
    if (!json_is_array(prompt) || json_array_size(prompt) == 0) {
        *err = "'prompt' must be a string, an array of token ids, or a one-element array of "
               "either";
        return -1;
    }
    const json_t *first = json_array_get(prompt, 0);
    if (json_is_integer(first))
        return token_array(out, prompt, err);
    if (json_array_size(prompt) > 1) {
        *err = "kvroute-sim serves one prompt per request";
        return -1;
    }
    if (json_is_string(first) || (json_is_array(first) && json_array_size(first) > 0 &&
                                  json_is_integer(json_array_get(first, 0))))
        return kvr_sim_render_completion(out, first, err);
    *err = "'prompt' must be a string, an array of token ids, or a one-element array of either";
    return -1;
}
