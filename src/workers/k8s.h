/* Kubernetes endpoint discovery: the workers behind one or more Services, found through their
 * EndpointSlices (discovery.k8s.io/v1) — listed, then watched — on the loop, over libcurl
 * (HTTPS, a kvr_upstream client of its own with the cluster's CA). What a worker is follows
 * the slices' endpoint conditions (Kubernetes API reference, EndpointSlice v1;
 * "EndpointSlices" concept page, "Conditions"):
 *   ready                    → a worker named after its pod (targetRef.name), URL http://IP:PORT
 *   serving and terminating  → draining (no new requests; in-flight ones finish)
 *   gone from every slice    → removed
 * An endpoint never seen ready is not added. The module keeps the slices and tells the owner
 * (the app) through hooks; it knows nothing of routes.
 *
 * Protocol (Kubernetes "API Concepts": "Efficient detection of changes", "Watch bookmarks",
 * "410 Gone responses"): GET .../namespaces/NS/endpointslices?labelSelector=
 * kubernetes.io/service-name=SVC, then the same with watch=1&allowWatchBookmarks=true&
 * resourceVersion=RV&timeoutSeconds=N, read as newline-delimited JSON events as they arrive.
 * A watch the server ends is resumed from the last resourceVersion at once; 410 (as the HTTP
 * status, or as an ERROR event whose Status has code 410) relists; any other failure (no
 * connection, TLS, 401/403, a malformed event, an event over the cap) is counted in
 * kvroute_discovery_errors_total{source="kubernetes"}, logged once per change of error state,
 * and retried with exponential backoff (from 500 ms up to backoff_max_ms) — the workers known
 * stay as they are meanwhile. The bearer token is read from its file before every request, so
 * a rotated (bound, projected) token is used on the next call. */
#ifndef KVR_WORKERS_K8S_H
#define KVR_WORKERS_K8S_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "obs/metrics.h"

/** The service-account mount every pod gets (Kubernetes "Accessing the Kubernetes API from a
 *  Pod"): token, ca.crt, namespace. */
#define KVR_K8S_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define KVR_K8S_MAX_SERVICES 16

/** Settings (flags --k8s-*; file `discovery: {kubernetes: {service, namespace, port}}`).
 *  Strings are borrowed from the configuration, which outlives the module. */
typedef struct kvr_k8s_cfg {
    const char *services[KVR_K8S_MAX_SERVICES]; /**< --k8s-service (repeatable): Service names
                                                     whose EndpointSlices are watched */
    size_t nservices;
    const char *ns;         /**< --k8s-namespace (NULL: the pod's, from KVR_K8S_SA_DIR) */
    const char *port;       /**< --k8s-port: a port name or number (NULL: the slice's only port,
                                 or the one named "http") */
    const char *api_url;    /**< --k8s-api-url (NULL: https://$KUBERNETES_SERVICE_HOST:
                                 $KUBERNETES_SERVICE_PORT) */
    const char *token_file; /**< --k8s-token-file (NULL: KVR_K8S_SA_DIR/token) */
    const char *ca_file;    /**< --k8s-ca-file (NULL: KVR_K8S_SA_DIR/ca.crt when present, else
                                 the system's CAs) */
    const char *kv_port;    /**< --k8s-kv-events-port: the port (name or number) of each
                                 worker's vLLM KV-event PUB socket, so `precise` gets its events
                                 (tcp://IP:PORT); NULL = none */
    const char *kv_replay_port; /**< --k8s-kv-replay-port: its replay ROUTER port; NULL = none */
    const char *kv_topic;   /**< --k8s-kv-topic: the events' topic (NULL = every message) */
    uint32_t data_parallel_size; /**< --k8s-data-parallel-size: each endpoint is a vLLM engine
                                      of this many data-parallel ranks (1 = plain workers);
                                      rank r's KV events on the events port + r, as vLLM
                                      publishes them */
    uint64_t watch_timeout_s;  /**< --k8s-watch-timeout-s: timeoutSeconds of a watch (300);
                                    the server ends it then and kvroute resumes it */
    uint64_t backoff_max_ms;   /**< --k8s-backoff-max-ms: longest wait between retries
                                    after errors (30000) */
    size_t max_event_bytes;    /**< --k8s-max-event-bytes: longest watch event line (4 MiB) */
    size_t max_list_bytes;     /**< --k8s-max-list-bytes: largest list body (32 MiB) */
    size_t max_endpoints;      /**< --k8s-max-endpoints: addresses kept per slice (1000, the
                                    API's own maximum per slice) */
} kvr_k8s_cfg;

/** Fills the defaults (no services). */
void kvr_k8s_cfg_default(kvr_k8s_cfg *c);

/** 1 when `s` (NUL-terminated; NULL counts as empty) is a DNS label as Kubernetes names
 *  Services and namespaces (RFC 1123: 1-63 bytes of a-z, 0-9 and '-', not starting or
 *  ending with '-'), else 0. */
int kvr_k8s_dns_label(const char *s);

/** 1 when `s` (NUL-terminated; NULL counts as empty) is a port as an EndpointSlice names
 *  it: a number 1-65535, or a port name (IANA_SVC_NAME: 1-15 of a-z, 0-9 and '-', at least
 *  one letter, no '-' at either end, no "--"), else 0. */
int kvr_k8s_port_ok(const char *s);

/** What the owner does with what the watch finds. Called on the loop. */
typedef struct kvr_k8s_hooks {
    /** A ready endpoint of `service` appeared: add worker `url` named `name` (the pod; the URL when the
     *  slice names no pod), with its KV-event endpoints `kv` and `kv_replay` ("tcp://IP:PORT",
     *  NULL when not configured or not in the slice). Returns 0, or -1 when refused (egress
     *  policy, duplicate URL): the module then leaves that endpoint alone until it
     *  disappears. */
    int (*add)(void *ud, const char *service, const char *name, const char *url,
               const char *kv, const char *kv_replay);
    /** A worker added by `add` became draining (1: serving but terminating, or not ready) or
     *  ready again (0). */
    void (*set_draining)(void *ud, const char *url, int draining);
    /** A worker added by `add` is gone from every slice. */
    void (*remove)(void *ud, const char *url);
    /** Connect-time check of the API server's address (the egress policy); NULL = none. */
    int (*allow_connect)(void *ud, const char *url, const struct sockaddr *sa);
    void *ud;
} kvr_k8s_hooks;

typedef struct kvr_k8s kvr_k8s;

/** Resolves the in-pod defaults, checks the names (service and namespace must be DNS labels)
 *  and the token file, and starts listing every service at once. Out of a pod without
 *  --k8s-namespace the namespace is "default" (kubectl's); without a service-account token
 *  (and no --k8s-token-file) calls go unauthenticated until one appears. `errors` is
 *  kvroute_discovery_errors_total{source}. Returns NULL with the reason in `err` when the
 *  settings cannot work (no API server known, an unreadable --k8s-token-file or
 *  --k8s-ca-file, bad names). */
kvr_k8s *kvr_k8s_start(uv_loop_t *loop, const kvr_k8s_cfg *cfg, const kvr_k8s_hooks *hooks,
                       kvr_metric *errors, char *err, size_t cap);

/** Stops every request and timer and frees the module once its handles are closed (no hook
 *  runs after this returns). NULL is a no-op. Not from inside a hook. */
void kvr_k8s_stop(kvr_k8s *k);

/** Workers the module has added and not removed (kvroute_discovery_workers{source=
 *  "kubernetes"}). */
size_t kvr_k8s_worker_count(const kvr_k8s *k);

#endif
