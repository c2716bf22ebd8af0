/* Admin endpoints: worker table and routing explanation. */
#include "api/admin.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "api/validate.h"
#include "proxy/keys.h"
#include "routing/policies.h"
#include "routing/policy_cache_aware.h"
#include "util/json_read.h"
#include "util/oai_error.h"

static char *g_token;

int kvr_admin_load_token(kvr_app *app, char *err, size_t cap)
{
    const char *path = app->cfg.admin_token_file;
    if (!path)
        return 0;
    FILE *f = fopen(path, "r");
    char line[1024] = "";
    if (!f || !fgets(line, sizeof(line), f)) {
        snprintf(err, cap, "--admin-token-file %s: cannot read it", path);
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    char *s = line, *e = line + strlen(line);
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    if (!*s) {
        snprintf(err, cap, "--admin-token-file %s: the token is empty", path);
        return -1;
    }
    g_token = strdup(s);
    return g_token ? 0 : -1;
}

static int authorized(kvr_http_req *r)
{
    if (!g_token)
        return 1;
    const char *h = kvr_http_req_header(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    const char *t = h + 7;
    size_t a = strlen(t), b = strlen(g_token);
    /* Compare every byte whatever the first difference, so timing tells nothing. */
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++)
        diff |= (unsigned char)(g_token[i] ^ (i < a ? t[i] : 0));
    return diff == 0;
}

static void reply(kvr_http_req *r, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    kvr_http_resp_simple(r, status, "application/json", NULL, 0, s ? s : "{}",
                         s ? strlen(s) : 2);
    free(s);
}

static void reply_error(kvr_http_req *r, int status, const char *msg,
                        const kvr_http_header *h, size_t n)
{
    kvr_buf b;
    kvr_buf_init(&b, 0);
    kvr_oai_error_json(&b, status, msg, NULL, NULL);
    kvr_http_resp_simple(r, status, "application/json", h, n, b.data, b.len);
    kvr_buf_free(&b);
}

static int is_cache_aware(const kvr_app *app)
{
    return app->policy_ops == &kvr_policy_cache_aware;
}

static void workers(kvr_app *app, kvr_http_req *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < kvr_registry_count(app->reg); i++) {
        kvr_worker *w = kvr_registry_at(app->reg, i);
        kvr_cache_aware_worker_stats st = {0};
        if (is_cache_aware(app))
            kvr_cache_aware_worker_stats_get(app->policy, w->id, &st);
        json_array_append_new(
            arr, json_pack("{s:s,s:b,s:b,s:b,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:I}", "url", w->url,
                           "eligible", kvr_worker_eligible(w), "healthy", w->healthy,
                           "draining", w->draining, "inflight", (json_int_t)w->inflight,
                           "requests", (json_int_t)w->requests, "index_blocks",
                           (json_int_t)st.index_blocks, "index_capacity",
                           (json_int_t)st.index_capacity, "sessions", (json_int_t)st.sessions,
                           "queue", w->queue, "running", w->running, "kv_usage", w->kv_usage,
                           "kv_tokens", (json_int_t)w->kv_tokens));
    }
    reply(r, 200, json_pack("{s:s,s:o}", "policy", app->policy_ops->name, "workers", arr));
}

static int endpoint_of(kvr_http_req *r, const json_t *body, kvr_endpoint *ep)
{
    const char *t = strchr(kvr_http_req_target(r), '?');
    if (t) {
        if (strstr(t, "endpoint=chat"))
            return *ep = KVR_EP_CHAT, 0;
        if (strstr(t, "endpoint=completions"))
            return *ep = KVR_EP_COMPLETIONS, 0;
        if (strstr(t, "endpoint=responses"))
            return *ep = KVR_EP_RESPONSES, 0;
        if (strstr(t, "endpoint="))
            return -1;
    }
    *ep = json_object_get(body, "messages")  ? KVR_EP_CHAT
          : json_object_get(body, "prompt") ? KVR_EP_COMPLETIONS
                                             : KVR_EP_RESPONSES;
    return 0;
}

static void debug_route(kvr_app *app, kvr_http_req *r)
{
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    json_error_t jerr;
    json_t *j = kvr_json_read(body, blen, &jerr);
    kvr_endpoint ep;
    char msg[300];
    const char *param = NULL;
    if (!j) {
        snprintf(msg, sizeof(msg), "invalid JSON body: %s", jerr.text);
        reply_error(r, 400, msg, NULL, 0);
        return;
    }
    if (endpoint_of(r, j, &ep) < 0 || kvr_api_validate(j, ep, msg, sizeof(msg), &param)) {
        if (!param)
            snprintf(msg, sizeof(msg), "endpoint must be chat, completions or responses");
        json_decref(j);
        reply_error(r, 400, msg, NULL, 0);
        return;
    }
    kvr_request_keys keys;
    int krc = kvr_request_keys_build(app, j, ep, r, &keys);
    kvr_pick pinned = {0};
    int is_pinned = kvr_proxy_pick_pinned(app, j, ep, &pinned);
    json_decref(j);
    size_t n = kvr_registry_eligible(app->reg, app->scratch);
    if (krc < 0 || n == 0) {
        kvr_request_keys_free(&keys);
        reply_error(r, 503, krc < 0 ? "out of memory" : "no eligible worker", NULL, 0);
        return;
    }
    kvr_pick pick = {0};
    json_t *rows = json_array();
    if (is_cache_aware(app)) {
        kvr_cache_aware_explain_row *ex = calloc(n, sizeof(*ex));
        if (ex && kvr_cache_aware_explain(app->policy, app->scratch, n, &keys.k, ex, &pick) == 0)
            for (size_t i = 0; i < n; i++)
                json_array_append_new(
                    rows, json_pack("{s:s,s:f,s:I,s:I,s:b,s:b}", "url", ex[i].worker->url,
                                    "match", ex[i].match, "matched_bytes",
                                    (json_int_t)ex[i].matched_bytes, "inflight",
                                    (json_int_t)ex[i].inflight, "overloaded", ex[i].overloaded,
                                    "session_owner", ex[i].session_owner));
        free(ex);
    } else {
        app->policy_ops->pick(app->policy, app->scratch, n, &keys.k, &pick);
        for (size_t i = 0; i < n; i++)
            json_array_append_new(rows, json_pack("{s:s,s:I}", "url", app->scratch[i]->url,
                                                  "inflight",
                                                  (json_int_t)app->scratch[i]->inflight));
    }
    if (is_pinned)
        pick = pinned;
    json_t *out = json_pack("{s:s,s:s?,s:s?,s:f,s:I,s:I,s:o}", "policy", app->policy_ops->name,
                            "decision", pick.decision, "worker",
                            pick.worker ? pick.worker->url : NULL, "match", pick.match,
                            "session_key_bytes", (json_int_t)keys.k.session_len,
                            "routing_text_bytes", (json_int_t)keys.k.text_len, "workers", rows);
    kvr_request_keys_free(&keys);
    reply(r, 200, out);
}

void kvr_admin_handle(kvr_http_req *r, void *ud)
{
    kvr_app *app = ud;
    const char *path = kvr_http_req_path(r), *method = kvr_http_req_method(r);
    if (!authorized(r)) {
        kvr_http_header h = {"WWW-Authenticate", 16, "Bearer", 6};
        reply_error(r, 401, "missing or wrong admin bearer token", &h, 1);
        return;
    }
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(path, "/workers") == 0) {
        if (get)
            workers(app, r);
        else
            reply_error(r, 405, "use GET", &(kvr_http_header){"Allow", 5, "GET", 3}, 1);
    } else if (strcmp(path, "/debug/route") == 0) {
        if (post)
            debug_route(app, r);
        else
            reply_error(r, 405, "use POST", &(kvr_http_header){"Allow", 5, "POST", 4}, 1);
    } else {
        reply_error(r, 404, "unknown admin path", NULL, 0);
    }
}
