/* Structured logging to stderr: one line per event, `ts=… level=… msg="…" key=value…`. */
#ifndef KVR_UTIL_LOG_H
#define KVR_UTIL_LOG_H

/** Levels, lowest first. Messages below the current level are dropped. */
typedef enum { KVR_LOG_DEBUG, KVR_LOG_INFO, KVR_LOG_WARN, KVR_LOG_ERROR } kvr_log_level;

/** Sets the minimum level printed (default KVR_LOG_INFO). */
void kvr_log_set_level(kvr_log_level lvl);
/** Parses "debug", "info", "warn" or "error"; returns -1 for anything else. */
int kvr_log_parse_level(const char *s);
/** Prints one line: timestamp, level, then the printf-formatted message. */
void kvr_log(kvr_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define KVR_DEBUG(...) kvr_log(KVR_LOG_DEBUG, __VA_ARGS__)
#define KVR_INFO(...) kvr_log(KVR_LOG_INFO, __VA_ARGS__)
#define KVR_WARN(...) kvr_log(KVR_LOG_WARN, __VA_ARGS__)
#define KVR_ERROR(...) kvr_log(KVR_LOG_ERROR, __VA_ARGS__)

#endif
