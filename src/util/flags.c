/* Table-driven flag parser (see flags.h). */
#include "util/flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const kvr_flag *find(const kvr_flag *t, size_t n, const char *name, size_t len)
{
    const kvr_flag *f = NULL;
    for (size_t k = 0; k < n; k++)
        if (strlen(t[k].name) == len && strncmp(t[k].name, name, len) == 0)
            f = &t[k];
    return f;
}

/* The field's C range as [lo, hi) — hi exclusive and a power of two, so exact as a double —
 * so a table whose bounds are wider than the field cannot make the conversion undefined. */
static void int_range(kvr_flag_type t, double *lo, double *hi)
{
    int bits = t == KVR_FLAG_INT ? (int)sizeof(int) * CHAR_BIT
             : t == KVR_FLAG_LONG ? (int)sizeof(long) * CHAR_BIT
             : t == KVR_FLAG_U32 ? 32
             : t == KVR_FLAG_U64 ? 64
                                 : (int)sizeof(size_t) * CHAR_BIT;
    int is_signed = t == KVR_FLAG_INT || t == KVR_FLAG_LONG;
    *hi = ldexp(1, is_signed ? bits - 1 : bits);
    *lo = is_signed ? -*hi : 0;
}

static int set_number(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    char *p = (char *)target + f->off, *end;
    int integral = f->type != KVR_FLAG_DOUBLE;
    double lo = -HUGE_VAL, hi = HUGE_VAL;
    if (integral)
        int_range(f->type, &lo, &hi);
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d < f->min || d > f->max || d < lo ||
        d >= hi || (integral && d != floor(d))) {
        snprintf(err, cap, "--%s: bad value '%s' (expected %s in [%g, %g])", f->name, v,
                 integral ? "an integer" : "a number", f->min, f->max);
        return -1;
    }
    int digits = v[0] && strspn(v, "0123456789") == strlen(v);
    switch (f->type) {
    case KVR_FLAG_INT:
        *(int *)p = (int)d;
        break;
    case KVR_FLAG_LONG:
        *(long *)p = (long)d;
        break;
    case KVR_FLAG_U32:
        *(uint32_t *)p = (uint32_t)d;
        break;
    case KVR_FLAG_U64:
        *(uint64_t *)p = digits ? (uint64_t)strtoull(v, NULL, 10) : (uint64_t)d;
        break;
    case KVR_FLAG_SIZE:
        *(size_t *)p = digits ? (size_t)strtoull(v, NULL, 10) : (size_t)d;
        break;
    default:
        *(double *)p = d;
    }
    return 0;
}

static int set_bool(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no",
                                                                                 "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
            *(int *)((char *)target + f->off) = strcasecmp(v, yes[i]) == 0;
            return 0;
        }
    }
    snprintf(err, cap, "--%s: bad value '%s' (expected true or false)", f->name, v);
    return -1;
}

static int set_value(void *target, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    if (f->type == KVR_FLAG_BOOL)
        return set_bool(target, f, v, err, cap);
    if (f->type == KVR_FLAG_STR) {
        *(const char **)((char *)target + f->off) = v;
        return 0;
    }
    if (f->type == KVR_FLAG_CUSTOM) {
        if (cap)
            err[0] = '\0';
        if (f->set(target, f, v, err, cap) == 0)
            return 0;
        if (cap && !err[0])
            snprintf(err, cap, "--%s: bad value '%s' (expected %s)", f->name, v, f->help);
        return -1;
    }
    return set_number(target, f, v, err, cap);
}

int kvr_flags_parse(const kvr_flag *table, size_t n, void *target, int argc, char **argv,
                    char *err, size_t cap)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, cap, "unexpected argument '%s' (see --help)", a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        const kvr_flag *f = find(table, n, name, eq ? (size_t)(eq - name) : strlen(name));
        if (!f) {
            snprintf(err, cap, "unknown flag '%s' (see --help)", a);
            return -1;
        }
        if (f->type == KVR_FLAG_BOOL && !eq) {
            *(int *)((char *)target + f->off) = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            snprintf(err, cap, "--%s needs a value", f->name);
            return -1;
        }
        if (set_value(target, f, v, err, cap) < 0)
            return -1;
    }
    return 0;
}

const kvr_flag *kvr_flags_find(const kvr_flag *table, size_t n, const char *name)
{
    return find(table, n, name, strlen(name));
}

int kvr_flags_set(const kvr_flag *f, void *target, const char *value, char *err, size_t cap)
{
    return set_value(target, f, value, err, cap);
}

static int print_default(FILE *out, const void *d, const kvr_flag *f)
{
    const char *p = (const char *)d + f->off;
    switch (f->type) {
    case KVR_FLAG_STR:
        fprintf(out, "%s", *(const char *const *)p ? *(const char *const *)p : "unset");
        break;
    case KVR_FLAG_BOOL:
        fputs(*(const int *)p ? "true" : "false", out);
        break;
    case KVR_FLAG_INT:
        fprintf(out, "%d", *(const int *)p);
        break;
    case KVR_FLAG_LONG:
        fprintf(out, "%ld", *(const long *)p);
        break;
    case KVR_FLAG_U32:
        fprintf(out, "%lu", (unsigned long)*(const uint32_t *)p);
        break;
    case KVR_FLAG_U64:
        fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case KVR_FLAG_SIZE:
        fprintf(out, "%zu", *(const size_t *)p);
        break;
    case KVR_FLAG_DOUBLE:
        fprintf(out, "%g", *(const double *)p);
        break;
    case KVR_FLAG_CUSTOM:
        if (!f->show)
            return 0;
        f->show(out, d, f);
        break;
    }
    return 1;
}

void kvr_flags_usage(FILE *out, const kvr_flag *table, size_t n, const void *defaults, int width)
{
    for (size_t k = 0; k < n; k++) {
        const kvr_flag *f = &table[k];
        fprintf(out, "  --%-*s %s", width, f->name, f->help);
        if (defaults && (f->type != KVR_FLAG_CUSTOM || f->show)) {
            fputs(" [", out);
            print_default(out, defaults, f);
            fputc(']', out);
        }
        fputc('\n', out);
    }
}
