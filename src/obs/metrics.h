/* Prometheus metrics registry and text exposition (format 0.0.4). Single-threaded: all calls
 * from the loop thread. Used by kvroute (kvroute_* names) and kvroute-sim (vLLM's vllm:* names). */
#ifndef KVR_OBS_METRICS_H
#define KVR_OBS_METRICS_H
#include <stddef.h>

#include "util/buf.h"

typedef struct kvr_metrics kvr_metrics;
typedef struct kvr_metric kvr_metric;

/** Creates an empty registry. Never returns NULL (aborts on OOM at boot). */
kvr_metrics *kvr_metrics_new(void);
/** Frees the registry and every family in it. */
void kvr_metrics_free(kvr_metrics *r);

/** Registers a family. `labels` are the label names (`nlabels` of them, may be 0); strings are
 *  copied. Names must be valid Prometheus names (colons allowed, as vLLM uses). The returned
 *  family is owned by the registry. Registering the same name again with the same type and
 *  labels (and bounds) returns the existing family; an invalid name, label name (`__*`, `le` on
 *  a histogram, duplicates), non-ascending/NaN bounds or a clashing re-registration logs an
 *  error and returns NULL, and every kvr_metric_* call on NULL is a no-op. A family without
 *  labels has its single series from the start, so it renders `name 0` before any update. */
kvr_metric *kvr_metrics_counter(kvr_metrics *r, const char *name, const char *help,
                                size_t nlabels, const char *const *labels);
kvr_metric *kvr_metrics_gauge(kvr_metrics *r, const char *name, const char *help,
                              size_t nlabels, const char *const *labels);
/** Histogram with `nb` strictly ascending upper bounds (the +Inf bucket is implicit; a trailing
 *  +Inf bound is dropped, as the Go client does). */
kvr_metric *kvr_metrics_histogram(kvr_metrics *r, const char *name, const char *help,
                                  size_t nlabels, const char *const *labels,
                                  const double *bounds, size_t nb);

/** Operations on the series with these label values (`values` has the family's nlabels
 *  strings; NULL when nlabels is 0; a NULL string counts as ""). A series is created on first
 *  use (the only allocation); updating an existing one is a hash lookup and never allocates.
 *  Operations that do not fit the family's type are ignored, as is a negative or NaN counter
 *  increment (counters only go up, as every Prometheus client enforces). */
void kvr_metric_inc(kvr_metric *m, const char *const *values, double v); /**< counter/gauge += v */
/** gauge = v; also accepted on a counter, to mirror a total kept elsewhere (e.g. CPU seconds). */
void kvr_metric_set(kvr_metric *m, const char *const *values, double v);
void kvr_metric_observe(kvr_metric *m, const char *const *values, double v); /**< histogram */
/** Current value of a counter/gauge series (0 if absent); histogram: the count. */
double kvr_metric_get(kvr_metric *m, const char *const *values);
/** Removes every series whose label `label` equals `value` (e.g. a worker that left). */
void kvr_metric_remove_matching(kvr_metric *m, const char *label, const char *value);

/** Returns the family registered under `name`, or NULL. Linear in the number of families:
 *  meant for setup and render hooks, not the per-request path (keep the returned pointer). */
kvr_metric *kvr_metrics_find(kvr_metrics *r, const char *name);

/** A hook run at the start of each render, to refresh gauges computed on demand. Several hooks
 *  may be added; they run in the order added. */
void kvr_metrics_on_render(kvr_metrics *r, void (*cb)(void *ud), void *ud);
/** Appends the whole exposition text (# HELP, # TYPE, series) to `out`. Families appear in
 *  registration order, series in creation order; HELP and TYPE are printed even for a family
 *  with no series (as Python's prometheus_client does). Values print in the shortest form that
 *  reads back to the same double (`3`, `0.1`, `NaN`, `+Inf`). Returns 0, or -1 with `out`
 *  unchanged when its cap would be exceeded or memory ran out. */
int kvr_metrics_render(kvr_metrics *r, kvr_buf *out);

/** Adds process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total and
 *  process_start_time_seconds (read from /proc/self at each render), as Prometheus' client
 *  libraries name them. Calling it twice is harmless. On a system without /proc the series
 *  stay at 0. */
void kvr_metrics_add_process(kvr_metrics *r);

/** One sample of a parsed exposition: `name`, its labels as "k=v" pairs, and the value. */
typedef struct kvr_prom_sample {
    const char *name;
    size_t nlabels;
    const char *const *label_names;
    const char *const *label_values;
    double value;
} kvr_prom_sample;
/** Parses Prometheus text format `text` (len bytes; needs no NUL), calling `cb` for each sample
 *  line (comments skipped; malformed lines skipped). Pointers in the sample are valid only
 *  during the call. Returns the number of samples parsed. Label values are unescaped (`\\`,
 *  `\"`, `\n`; any other escape makes the line malformed, as in Prometheus' own parser); a
 *  trailing timestamp is accepted and ignored; values are decimal or hex floats, `NaN`,
 *  `+Inf`, `-Inf`. `cb` may be NULL (just counts). */
size_t kvr_prom_parse(const char *text, size_t len,
                      void (*cb)(void *ud, const kvr_prom_sample *s), void *ud);

#endif
