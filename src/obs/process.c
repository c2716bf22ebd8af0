/* process_* metrics read from /proc at each render, named and computed as Prometheus' client
 * libraries do (client_golang's process collector, Python prometheus_client's
 * ProcessCollector): RSS from statm × page size, fds by listing /proc/self/fd, CPU from
 * utime+stime ticks, start time from starttime ticks after the boot time in /proc/stat. */
#include "obs/metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RSS_NAME "process_resident_memory_bytes"
#define FDS_NAME "process_open_fds"
#define CPU_NAME "process_cpu_seconds_total"
#define START_NAME "process_start_time_seconds"

/* Reads up to cap-1 bytes of a small /proc file, NUL-terminated. Returns bytes read or -1. */
static long read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (long)n;
}

static int read_rss(double *out)
{
    char buf[256];
    if (read_small("/proc/self/statm", buf, sizeof(buf)) <= 0)
        return -1;
    unsigned long size, resident;
    if (sscanf(buf, "%lu %lu", &size, &resident) != 2)
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    *out = (double)resident * (double)(page > 0 ? page : 4096);
    return 0;
}

static int count_fds(double *out)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int self = dirfd(d);
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        /* The directory stream's own fd is listed too; it is ours, not the process's. */
        if (atoi(e->d_name) == self)
            continue;
        n++;
    }
    closedir(d);
    *out = (double)n;
    return 0;
}

/* /proc/self/stat: fields after "(comm)" — comm may hold spaces and ')' so scan from the last
 * ')'. utime is field 14, stime 15, starttime 22 (proc(5)), all in clock ticks. */
static int read_stat(double *cpu_s, double *start_ticks)
{
    char buf[2048];
    if (read_small("/proc/self/stat", buf, sizeof(buf)) <= 0)
        return -1;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    unsigned long long utime = 0, stime = 0, start = 0;
    int field = 2; /* the comm field just ended */
    while (*p && field < 22) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        field++;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (field == 14)
            utime = v;
        else if (field == 15)
            stime = v;
        else if (field == 22)
            start = v;
        p = end;
        while (*p && *p != ' ')
            p++;
    }
    if (field < 22)
        return -1;
    long tck = sysconf(_SC_CLK_TCK);
    if (tck <= 0)
        tck = 100;
    *cpu_s = (double)(utime + stime) / (double)tck;
    *start_ticks = (double)start / (double)tck;
    return 0;
}

static int read_btime(double *out)
{
    char buf[16384];
    if (read_small("/proc/stat", buf, sizeof(buf)) <= 0)
        return -1;
    char *p = strstr(buf, "\nbtime ");
    if (!p)
        return -1;
    *out = strtod(p + 7, NULL);
    return 0;
}

static void refresh(void *ud)
{
    kvr_metrics *r = ud;
    double v, w;
    if (read_rss(&v) == 0)
        kvr_metric_set(kvr_metrics_find(r, RSS_NAME), NULL, v);
    if (count_fds(&v) == 0)
        kvr_metric_set(kvr_metrics_find(r, FDS_NAME), NULL, v);
    double boot;
    if (read_stat(&v, &w) == 0) {
        kvr_metric_set(kvr_metrics_find(r, CPU_NAME), NULL, v);
        if (read_btime(&boot) == 0)
            kvr_metric_set(kvr_metrics_find(r, START_NAME), NULL, boot + w);
    }
}

void kvr_metrics_add_process(kvr_metrics *r)
{
    if (!r || kvr_metrics_find(r, RSS_NAME))
        return;
    kvr_metrics_gauge(r, RSS_NAME, "Resident memory size in bytes.", 0, NULL);
    kvr_metrics_gauge(r, FDS_NAME, "Number of open file descriptors.", 0, NULL);
    kvr_metrics_counter(r, CPU_NAME, "Total user and system CPU time spent in seconds.", 0,
                        NULL);
    kvr_metrics_gauge(r, START_NAME, "Start time of the process since unix epoch in seconds.", 0,
                      NULL);
    /* The hook finds the families by name each render so it needs no state of its own (and
     * nothing to free). */
    kvr_metrics_on_render(r, refresh, r);
}
