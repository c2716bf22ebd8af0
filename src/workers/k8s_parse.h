/* Kubernetes EndpointSlice JSON (discovery.k8s.io/v1) and watch events, as the API server
 * sends them, into plain structs. Pure: no I/O, no loop; fed bytes from outside (the API
 * server), so every shape is checked and anything unexpected is refused or skipped, never
 * trusted (fuzz/fuzz_k8s.c).
 *
 * Shapes (Kubernetes API reference, "EndpointSlice v1 discovery.k8s.io", and "API Concepts",
 * "Efficient detection of changes"):
 *   list:  {"kind":"EndpointSliceList","metadata":{"resourceVersion":"N"},"items":[SLICE...]}
 *   watch: one JSON object per line, {"type":"ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR",
 *          "object":SLICE or, for ERROR, a Status {"kind":"Status","code":410,
 *          "reason":"Expired"|"Gone",...}}
 *   SLICE: {"metadata":{"name","resourceVersion"},"addressType":"IPv4"|"IPv6"|"FQDN",
 *           "endpoints":[{"addresses":["10.0.0.7"],"conditions":{"ready","serving",
 *           "terminating"},"targetRef":{"kind":"Pod","name":"vllm-0"}}],
 *           "ports":[{"name":"http","port":8000,"protocol":"TCP"}]}
 * Conditions as the API defines them: `ready` null/absent means ready; `serving` null/absent
 * defers to `ready`; `terminating` null/absent means false. */
#ifndef KVR_WORKERS_K8S_PARSE_H
#define KVR_WORKERS_K8S_PARSE_H
#include <stddef.h>

/** Longest pod name kept (a DNS subdomain is at most 253 bytes). */
#define KVR_K8S_NAME_MAX 253
/** Longest resourceVersion kept (opaque to clients; etcd revisions are decimal numbers). */
#define KVR_K8S_RV_MAX 64

/** One endpoint address of a slice, resolved to a worker URL. */
typedef struct kvr_k8s_endpoint {
    char name[KVR_K8S_NAME_MAX + 1]; /**< targetRef.name (the pod), or "" when absent or not
                                          a DNS name ([a-z0-9.-], as Kubernetes spells one) */
    char url[80];                    /**< "http://IP:PORT" ("http://[IPv6]:PORT") */
    int ready;                       /**< conditions.ready (null → 1) */
    int serving;                     /**< conditions.serving (null → ready) */
    int terminating;                 /**< conditions.terminating (null → 0) */
    char kv_url[80];                 /**< "tcp://IP:PORT" of its KV-event PUB socket when the
                                          selector's kv_port matched, else "" */
    char kv_replay_url[80];          /**< "tcp://IP:PORT" of its replay socket, or "" */
} kvr_k8s_endpoint;

/** One EndpointSlice, its endpoints resolved against a port selector. Owns `eps`
 *  (kvr_k8s_slice_free). */
typedef struct kvr_k8s_slice {
    char name[KVR_K8S_NAME_MAX + 1]; /**< metadata.name (required) */
    char rv[KVR_K8S_RV_MAX + 1];     /**< metadata.resourceVersion ("" when absent) */
    int port;                        /**< the port chosen (0 when none matched: no endpoints) */
    int kv_port, kv_replay_port;     /**< the KV-event ports chosen (0 = none) */
    kvr_k8s_endpoint *eps;           /**< IPv4/IPv6 addresses with a valid address and port;
                                          FQDN slices and malformed addresses are skipped */
    size_t neps;
} kvr_k8s_slice;

/** Frees what `s` owns (not `s`); safe on a zeroed slice. */
void kvr_k8s_slice_free(kvr_k8s_slice *s);

/** Watch event types. */
typedef enum kvr_k8s_event_type {
    KVR_K8S_ADDED,
    KVR_K8S_MODIFIED,
    KVR_K8S_DELETED,
    KVR_K8S_BOOKMARK, /**< only the resourceVersion (allowWatchBookmarks) */
    KVR_K8S_ERROR,    /**< a Status: `code` (410 = the resourceVersion is too old: relist) */
} kvr_k8s_event_type;

/** One watch event. `slice` is filled for ADDED, MODIFIED, DELETED (owned: free it). */
typedef struct kvr_k8s_event {
    kvr_k8s_event_type type;
    kvr_k8s_slice slice;
    char rv[KVR_K8S_RV_MAX + 1]; /**< the object's resourceVersion ("" when absent) */
    int code;                    /**< ERROR: Status.code (0 when absent) */
    char reason[32];             /**< ERROR: Status.reason (cut to fit; "" when absent) */
} kvr_k8s_event;

/** The port selectors (--k8s-port and the KV-event ones). --k8s-port: NULL or "" picks the slice's only port (its first when
 *  several, a port named "http" when there is one); digits name a port number used as it is;
 *  anything else a port name, which the slice must list (else the slice yields no endpoint).
 *  Endpoints are capped at `max_eps` per slice (the rest ignored). */
typedef struct kvr_k8s_sel {
    const char *port;
    size_t max_eps;
    const char *kv_port;        /**< KV-event port (vLLM --kv-events-config endpoint): a name
                                     the slice must list or a number; NULL = none */
    const char *kv_replay_port; /**< its replay port, the same way; NULL = none */
} kvr_k8s_sel;

/** Parses an EndpointSliceList body (`len` bytes). On success returns the number of slices
 *  (into `*out`, malloc'd, each to free with kvr_k8s_slice_free, then free(*out)) and the
 *  list's resourceVersion into `rv` (KVR_K8S_RV_MAX + 1 bytes). Items that are not valid
 *  slices are skipped. Returns -1 with a reason in `err` when the body is not such a list. */
int kvr_k8s_parse_list(const char *body, size_t len, const kvr_k8s_sel *sel,
                       kvr_k8s_slice **out, char *rv, char *err, size_t cap);

/** Parses one watch event line (`len` bytes, without its newline) into `ev`. Returns 0, or -1
 *  with a reason in `err` (unknown type, not an object, a slice event without a valid slice);
 *  ev->slice is then empty. */
int kvr_k8s_parse_event(const char *line, size_t len, const kvr_k8s_sel *sel, kvr_k8s_event *ev,
                        char *err, size_t cap);

#endif
