/* Routing keys of an inbound request. */
#include "proxy/keys.h"

#include <stdlib.h>
#include <string.h>

#include "cluster/entry.h"
#include "events/kvevents.h"
#include "routing/keys.h"
#include "routing/text_scan.h"
#include "util/json_read.h"

static const char *get_header(void *ctx, const char *name, size_t *len)
{
    const char *v = kvr_http_req_header(ctx, name);
    if (v)
        *len = strlen(v);
    return v;
}

/* Replicas sharing state key sessions by the digest the routing log carries (never the id),
 * so a session bound through another replica is found here by the same id. */
static void cluster_session(kvr_app *app, kvr_request_keys *out)
{
    if (!app->cluster || !out->session.len)
        return;
    unsigned char d[16];
    kvr_entry_session_digest(out->session.data, out->session.len, d);
    kvr_buf_reset(&out->session);
    kvr_buf_append(&out->session, d, sizeof(d));
}

int kvr_request_keys_build(kvr_app *app, const kvr_route *route, const json_t *body,
                           kvr_endpoint ep, kvr_http_req *r, kvr_request_keys *out)
{
    memset(out, 0, sizeof(*out));
    kvr_buf_init(&out->session, 0);
    kvr_buf_init(&out->text, app->cfg.max_routing_text_bytes);
    /* count_tokens leaves the KV cache as it was: keys would teach a session or a prefix to a
     * worker that holds neither. */
    if (!route->ops->uses_keys || ep == KVR_EP_COUNT_TOKENS)
        return 0;
    int rc = kvr_route_keys_build(body, (kvr_route_kind)ep, get_header, r,
                                  &app->session_sources, &out->text, &out->session);
    cluster_session(app, out);
    if (out->session.len) {
        out->k.session = out->session.data;
        out->k.session_len = out->session.len;
    }
    if (out->text.len) {
        out->k.text = out->text.data;
        out->k.text_len = out->text.len;
        out->k.kept = &out->kept;
    }
    return rc < 0 ? -1 : 0;
}

int kvr_request_keys_build_fields(kvr_app *app, const kvr_route *route,
                                  const kvr_body_fields *body, kvr_endpoint ep,
                                  kvr_http_req *r, kvr_request_keys *out)
{
    memset(out, 0, sizeof(*out));
    kvr_buf_init(&out->session, 0);
    kvr_buf_init(&out->text, app->cfg.max_routing_text_bytes);
    if (!route->ops->uses_keys || ep == KVR_EP_COUNT_TOKENS)
        return 0; /* as kvr_request_keys_build() */
    int rc = kvr_body_session_key(body, get_header, r, &app->session_sources, &out->session);
    cluster_session(app, out);
    if (out->session.len) {
        out->k.session = out->session.data;
        out->k.session_len = out->session.len;
    }
    if (rc < 0)
        return -1;
    if (!body || !body->object || (route->ops->text_without_session && out->session.len))
        return 0;
    if (ep == KVR_EP_CHAT) {
        /* From the scan: the tree's text without the tree (routing/text_scan.h). */
        size_t nmsgs;
        const kvr_json_elem *msgs = kvr_body_messages(body, &nmsgs);
        uint64_t id;
        rc = kvr_route_text_scan_id(body->buf, kvr_body_field(body, KVR_FIELD_TOOLS),
                                    kvr_body_field(body, KVR_FIELD_FUNCTIONS),
                                    kvr_body_field(body, KVR_FIELD_MESSAGES), msgs, nmsgs,
                                    app->text_cache, &out->text, &id);
        if (rc >= 0 && id) { /* the text as built: a reply appended later keeps this prefix */
            out->kept.text_id = id;
            out->kept.text_id_len = out->text.len;
        }
    } else if (ep == KVR_EP_COMPLETIONS) {
        rc = kvr_route_text_scan_prompt(body->buf, kvr_body_field(body, KVR_FIELD_PROMPT),
                                        &out->text);
    } else {
        json_t *tree = kvr_json_read(body->buf, body->len, NULL);
        if (!tree)
            return -1; /* the scan accepted it: only memory can fail here */
        rc = kvr_route_text_build(tree, (kvr_route_kind)ep, &out->text);
        json_decref(tree);
    }
    if (out->text.len) {
        out->k.text = out->text.data;
        out->k.text_len = out->text.len;
        out->k.kept = &out->kept;
    }
    return rc < 0 ? -1 : 0;
}

void kvr_request_keys_free(kvr_request_keys *rk)
{
    kvr_buf_free(&rk->session);
    kvr_buf_free(&rk->text);
    free(rk->tokens);
    rk->tokens = NULL;
    kvr_prefix_keys_free(&rk->kept);
    memset(&rk->k, 0, sizeof(rk->k));
}

int kvr_request_keys_set_tokens(kvr_request_keys *rk, const uint32_t *ids, size_t n)
{
    free(rk->tokens);
    rk->tokens = n ? malloc(n * sizeof(*ids)) : NULL;
    rk->k.tokens = rk->tokens;
    rk->k.ntokens = rk->tokens ? n : 0;
    if (!rk->tokens)
        return n ? -1 : 0;
    memcpy(rk->tokens, ids, n * sizeof(*ids));
    return 0;
}

int kvr_request_keys_tokenize(kvr_app *app, kvr_route *route, kvr_endpoint ep, kvr_http_req *r,
                              const kvr_request_keys *rk, kvr_tokenize_cb cb, void *ud,
                              kvr_tokenize_op **op)
{
    *op = NULL;
    size_t n = kvr_route_eligible(route, route->scratch);
    if (!n || (ep != KVR_EP_CHAT && ep != KVR_EP_COMPLETIONS) || !app->tokenizer)
        return 0;
    /* Policies that read the ids only for workers with KV events skip the call without any. */
    int any = route->ops->uses_tokens != 2;
    for (size_t i = 0; i < n && !any; i++)
        any = kvr_kv_events_configured(app->kv, route->scratch[i]->id);
    if (!any)
        return 0;
    /* Every worker of a route tokenizes alike (one model); the least loaded answers first. */
    kvr_worker *w = kvr_policy_least_loaded(route->scratch, n);
    const kvr_route_target *t = kvr_route_target_of(route, w);
    size_t blen;
    const char *body = kvr_http_req_body(r, &blen);
    const char *hdr = kvr_http_req_header(r, "x-kvroute-token-ids");
    kvr_tokenize_req tr = {
        .chat = ep == KVR_EP_CHAT,
        .body = body,
        .body_len = blen,
        .header_ids = hdr,
        .header_len = hdr ? strlen(hdr) : 0,
        .cache_key = rk->k.text_len ? rk->k.text : NULL, /* the model is in the digest */
        .cache_key_len = rk->k.text_len,
        .worker_url = kvr_worker_base(w), /* a data-parallel rank's engine */
        .model = t ? t->model : NULL,
        .api_key = w->api_key,
    };
    *op = kvr_tokenize(app->tokenizer, &tr, cb, ud);
    return 1;
}
