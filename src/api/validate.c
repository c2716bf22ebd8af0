/* OpenAI and Anthropic request body validation. */
#include "api/validate.h"

#include <stdio.h>

static int fail(char *msg, size_t cap, const char **param, const char *p, const char *text)
{
    snprintf(msg, cap, "%s", text);
    *param = p;
    return 400;
}

static int all_of(const json_t *a, int (*pred)(const json_t *))
{
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) if (!pred(v)) return 0;
    return 1;
}

static int is_string(const json_t *v)
{
    return json_is_string(v);
}

static int is_token(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0;
}

static int is_token_array(const json_t *v)
{
    return json_is_array(v) && json_array_size(v) > 0 && all_of(v, is_token);
}

static int valid_prompt(const json_t *p)
{
    if (json_is_string(p))
        return 1;
    if (!json_is_array(p) || json_array_size(p) == 0)
        return 0;
    return all_of(p, is_string) || all_of(p, is_token) || all_of(p, is_token_array);
}

int kvr_api_validate(const json_t *body, kvr_endpoint ep, char *msg, size_t cap,
                     const char **param)
{
    if (!json_is_object(body))
        return fail(msg, cap, param, NULL, "the request body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (!model)
        return fail(msg, cap, param, "model", "you must provide a model parameter");
    if (!json_is_string(model))
        return fail(msg, cap, param, "model", "'model' must be a string");
    const json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return fail(msg, cap, param, "stream", "'stream' must be a boolean");
    if (ep == KVR_EP_MESSAGES || ep == KVR_EP_COUNT_TOKENS) {
        const json_t *sys = json_object_get(body, "system");
        if (sys && !json_is_string(sys) && !json_is_array(sys) && !json_is_null(sys))
            return fail(msg, cap, param, "system", "'system' must be a string or an array of "
                                                   "text blocks");
        const json_t *tools = json_object_get(body, "tools");
        if (tools && !json_is_array(tools) && !json_is_null(tools))
            return fail(msg, cap, param, "tools", "'tools' must be an array");
    }
    if (ep == KVR_EP_CHAT || ep == KVR_EP_MESSAGES || ep == KVR_EP_COUNT_TOKENS) {
        const json_t *m = json_object_get(body, "messages");
        if (!m)
            return fail(msg, cap, param, "messages", "you must provide a messages parameter");
        if (!json_is_array(m) || json_array_size(m) == 0)
            return fail(msg, cap, param, "messages", "'messages' must be a non-empty array");
        size_t i;
        const json_t *v;
        json_array_foreach(m, i, v)
        {
            if (!json_is_object(v) || !json_is_string(json_object_get(v, "role"))) {
                snprintf(msg, cap, "'messages.%zu' must be an object with a string 'role'", i);
                *param = "messages";
                return 400;
            }
        }
    } else if (ep == KVR_EP_COMPLETIONS) {
        const json_t *p = json_object_get(body, "prompt");
        if (!p)
            return fail(msg, cap, param, "prompt", "you must provide a prompt parameter");
        if (!valid_prompt(p))
            return fail(msg, cap, param, "prompt",
                        "'prompt' must be a string, an array of strings, an array of token "
                        "ids or an array of token-id arrays");
    } else {
        const json_t *in = json_object_get(body, "input");
        if (in && !json_is_string(in) && !json_is_array(in))
            return fail(msg, cap, param, "input", "'input' must be a string or an array");
    }
    return 0;
}
