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

/* Chat's `messages`: a non-empty array of objects with a string `role`. */
static int check_messages(const json_t *m, char *msg, size_t cap, const char **param)
{
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
    return 0;
}

/* A required prompt-like field (`field`), or a chat-style `messages` list instead when
 * `chat_form` (vLLM's chat variants of embeddings, pooling, classify and tokenize). */
static int check_input(const json_t *body, const char *field, int chat_form, char *msg,
                       size_t cap, const char **param)
{
    const json_t *m = json_object_get(body, "messages");
    if (chat_form && m)
        return check_messages(m, msg, cap, param);
    const json_t *p = json_object_get(body, field);
    if (!p) {
        snprintf(msg, cap, chat_form ? "you must provide '%s' or 'messages'"
                                     : "you must provide a %s parameter", field);
        *param = field;
        return 400;
    }
    if (!valid_prompt(p)) {
        snprintf(msg, cap, "'%s' must be a string, an array of strings, an array of token ids "
                 "or an array of token-id arrays", field);
        *param = field;
        return 400;
    }
    return 0;
}

/* A text field of rerank and score: a string, a list, or a multimodal object (vLLM's
 * ScoreMultiModalParam). */
static int check_text(const json_t *body, const char *field, int required, char *msg,
                      size_t cap, const char **param)
{
    const json_t *v = json_object_get(body, field);
    if (!v && !required)
        return 0;
    *param = field;
    if (!v) {
        snprintf(msg, cap, "you must provide a %s parameter", field);
        return 400;
    }
    if (!json_is_string(v) && !json_is_array(v) && !json_is_object(v)) {
        snprintf(msg, cap, "'%s' must be a string, an array or an object", field);
        return 400;
    }
    return 0;
}

/* Anthropic Messages (and count_tokens): `system` and `tools`, before `messages`. */
static int check_anthropic(const json_t *body, char *msg, size_t cap, const char **param)
{
    const json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_string(sys) && !json_is_array(sys) && !json_is_null(sys))
        return fail(msg, cap, param, "system",
                    "'system' must be a string or an array of text blocks");
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_array(tools) && !json_is_null(tools))
        return fail(msg, cap, param, "tools", "'tools' must be an array");
    return 0;
}

int kvr_api_validate(const json_t *body, kvr_endpoint ep, char *msg, size_t cap,
                     const char **param)
{
    if (!json_is_object(body))
        return fail(msg, cap, param, NULL, "the request body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (!model && !kvr_endpoint_model_optional(ep))
        return fail(msg, cap, param, "model", "you must provide a model parameter");
    if (model && !json_is_string(model))
        return fail(msg, cap, param, "model", "'model' must be a string");
    const json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return fail(msg, cap, param, "stream", "'stream' must be a boolean");
    const json_t *in;
    int rc;
    switch (ep) {
    case KVR_EP_CHAT:
        return check_messages(json_object_get(body, "messages"), msg, cap, param);
    case KVR_EP_MESSAGES:
    case KVR_EP_COUNT_TOKENS:
        rc = check_anthropic(body, msg, cap, param);
        return rc ? rc : check_messages(json_object_get(body, "messages"), msg, cap, param);
    case KVR_EP_COMPLETIONS:
        return check_input(body, "prompt", 0, msg, cap, param);
    case KVR_EP_RESPONSES:
        in = json_object_get(body, "input");
        if (in && !json_is_string(in) && !json_is_array(in))
            return fail(msg, cap, param, "input", "'input' must be a string or an array");
        return 0;
    case KVR_EP_EMBEDDINGS:
    case KVR_EP_POOLING:
    case KVR_EP_CLASSIFY:
        return check_input(body, "input", 1, msg, cap, param);
    case KVR_EP_TOKENIZE:
        return check_input(body, "prompt", 1, msg, cap, param);
    case KVR_EP_DETOKENIZE:
        in = json_object_get(body, "tokens");
        if (!in)
            return fail(msg, cap, param, "tokens", "you must provide a tokens parameter");
        if (!json_is_array(in) || !all_of(in, is_token))
            return fail(msg, cap, param, "tokens", "'tokens' must be an array of token ids");
        return 0;
    case KVR_EP_RERANK:
    case KVR_EP_RERANK_BARE:
        rc = check_text(body, "query", 1, msg, cap, param);
        return rc ? rc : check_text(body, "documents", 1, msg, cap, param);
    case KVR_EP_SCORE:
        rc = check_text(body, "text_1", 0, msg, cap, param);
        return rc ? rc : check_text(body, "text_2", 0, msg, cap, param);
    default:
        return fail(msg, cap, param, NULL, "unknown endpoint");
    }
}

/* ---- the same rules on a scan (routing/fields.h): same statuses, messages and params ---- */

#define KIND(f, w) (kvr_body_field((f), (w))->kind)

static int s_present(const kvr_json_span *v)
{
    return v->kind != KVR_JSON_ABSENT;
}

static int s_valid_prompt(const kvr_json_span *p)
{
    if (p->kind == KVR_JSON_STRING)
        return 1;
    if (p->kind != KVR_JSON_ARRAY || p->count == 0)
        return 0;
    return !p->nonstring || !p->nontoken || !p->nontokarr;
}

static int s_check_messages(const kvr_json_span *m, char *msg, size_t cap, const char **param)
{
    if (!s_present(m))
        return fail(msg, cap, param, "messages", "you must provide a messages parameter");
    if (m->kind != KVR_JSON_ARRAY || m->count == 0)
        return fail(msg, cap, param, "messages", "'messages' must be a non-empty array");
    if (m->first_norole < m->count) {
        snprintf(msg, cap, "'messages.%zu' must be an object with a string 'role'",
                 m->first_norole);
        *param = "messages";
        return 400;
    }
    return 0;
}

static int s_check_input(const kvr_body_fields *f, kvr_field which, const char *field,
                         int chat_form, char *msg, size_t cap, const char **param)
{
    const kvr_json_span *m = kvr_body_field(f, KVR_FIELD_MESSAGES);
    if (chat_form && s_present(m))
        return s_check_messages(m, msg, cap, param);
    const kvr_json_span *p = kvr_body_field(f, which);
    if (!s_present(p)) {
        snprintf(msg, cap, chat_form ? "you must provide '%s' or 'messages'"
                                     : "you must provide a %s parameter", field);
        *param = field;
        return 400;
    }
    if (!s_valid_prompt(p)) {
        snprintf(msg, cap, "'%s' must be a string, an array of strings, an array of token ids "
                 "or an array of token-id arrays", field);
        *param = field;
        return 400;
    }
    return 0;
}

static int s_check_text(const kvr_body_fields *f, kvr_field which, const char *field,
                        int required, char *msg, size_t cap, const char **param)
{
    kvr_json_kind k = KIND(f, which);
    if (k == KVR_JSON_ABSENT && !required)
        return 0;
    *param = field;
    if (k == KVR_JSON_ABSENT) {
        snprintf(msg, cap, "you must provide a %s parameter", field);
        return 400;
    }
    if (k != KVR_JSON_STRING && k != KVR_JSON_ARRAY && k != KVR_JSON_OBJECT) {
        snprintf(msg, cap, "'%s' must be a string, an array or an object", field);
        return 400;
    }
    return 0;
}

static int s_check_anthropic(const kvr_body_fields *f, char *msg, size_t cap,
                             const char **param)
{
    kvr_json_kind sys = KIND(f, KVR_FIELD_SYSTEM), tools = KIND(f, KVR_FIELD_TOOLS);
    if (sys != KVR_JSON_ABSENT && sys != KVR_JSON_STRING && sys != KVR_JSON_ARRAY &&
        sys != KVR_JSON_NULL)
        return fail(msg, cap, param, "system",
                    "'system' must be a string or an array of text blocks");
    if (tools != KVR_JSON_ABSENT && tools != KVR_JSON_ARRAY && tools != KVR_JSON_NULL)
        return fail(msg, cap, param, "tools", "'tools' must be an array");
    return 0;
}

int kvr_api_validate_fields(const kvr_body_fields *f, kvr_endpoint ep, char *msg, size_t cap,
                            const char **param)
{
    if (!f->object)
        return fail(msg, cap, param, NULL, "the request body must be a JSON object");
    kvr_json_kind model = KIND(f, KVR_FIELD_MODEL), stream = KIND(f, KVR_FIELD_STREAM);
    if (model == KVR_JSON_ABSENT && !kvr_endpoint_model_optional(ep))
        return fail(msg, cap, param, "model", "you must provide a model parameter");
    if (model != KVR_JSON_ABSENT && model != KVR_JSON_STRING)
        return fail(msg, cap, param, "model", "'model' must be a string");
    if (stream != KVR_JSON_ABSENT && stream != KVR_JSON_TRUE && stream != KVR_JSON_FALSE &&
        stream != KVR_JSON_NULL)
        return fail(msg, cap, param, "stream", "'stream' must be a boolean");
    const kvr_json_span *in;
    int rc;
    switch (ep) {
    case KVR_EP_CHAT:
        return s_check_messages(kvr_body_field(f, KVR_FIELD_MESSAGES), msg, cap, param);
    case KVR_EP_MESSAGES:
    case KVR_EP_COUNT_TOKENS:
        rc = s_check_anthropic(f, msg, cap, param);
        return rc ? rc : s_check_messages(kvr_body_field(f, KVR_FIELD_MESSAGES), msg, cap, param);
    case KVR_EP_COMPLETIONS:
        return s_check_input(f, KVR_FIELD_PROMPT, "prompt", 0, msg, cap, param);
    case KVR_EP_RESPONSES:
        in = kvr_body_field(f, KVR_FIELD_INPUT);
        if (s_present(in) && in->kind != KVR_JSON_STRING && in->kind != KVR_JSON_ARRAY)
            return fail(msg, cap, param, "input", "'input' must be a string or an array");
        return 0;
    case KVR_EP_EMBEDDINGS:
    case KVR_EP_POOLING:
    case KVR_EP_CLASSIFY:
        return s_check_input(f, KVR_FIELD_INPUT, "input", 1, msg, cap, param);
    case KVR_EP_TOKENIZE:
        return s_check_input(f, KVR_FIELD_PROMPT, "prompt", 1, msg, cap, param);
    case KVR_EP_DETOKENIZE:
        in = kvr_body_field(f, KVR_FIELD_TOKENS);
        if (!s_present(in))
            return fail(msg, cap, param, "tokens", "you must provide a tokens parameter");
        if (in->kind != KVR_JSON_ARRAY || in->nontoken)
            return fail(msg, cap, param, "tokens", "'tokens' must be an array of token ids");
        return 0;
    case KVR_EP_RERANK:
    case KVR_EP_RERANK_BARE:
        rc = s_check_text(f, KVR_FIELD_QUERY, "query", 1, msg, cap, param);
        return rc ? rc : s_check_text(f, KVR_FIELD_DOCUMENTS, "documents", 1, msg, cap, param);
    case KVR_EP_SCORE:
        rc = s_check_text(f, KVR_FIELD_TEXT_1, "text_1", 0, msg, cap, param);
        return rc ? rc : s_check_text(f, KVR_FIELD_TEXT_2, "text_2", 0, msg, cap, param);
    default:
        return fail(msg, cap, param, NULL, "unknown endpoint");
    }
}
