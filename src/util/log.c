/* Structured logging to stderr. */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static kvr_log_level g_level = KVR_LOG_INFO;
static const char *const names[] = {"debug", "info", "warn", "error"};

void kvr_log_set_level(kvr_log_level lvl)
{
    g_level = lvl;
}

int kvr_log_parse_level(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void kvr_log(kvr_log_level lvl, const char *fmt, ...)
{
    if (lvl < g_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            names[lvl], msg);
}
