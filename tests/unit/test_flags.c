/* Shared flag parser: both syntaxes, bounds, integers, unknown/missing, custom and repeatable
 * flags, and a usage text that shows defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/flags.h"

typedef struct {
    const char *name;
    int port;
    long stall;
    uint32_t blocks;
    uint64_t seed;
    size_t bytes;
    double ratio;
    int mode; /* 0 = slow, 1 = fast */
    const char *urls[3];
    size_t nurls;
} cfg;

static int set_mode(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)err, (void)cap;
    int *m = (int *)((char *)t + f->off);
    if (strcmp(v, "slow") == 0)
        *m = 0;
    else if (strcmp(v, "fast") == 0)
        *m = 1;
    else
        return -1;
    return 0;
}

static void show_mode(FILE *out, const void *t, const kvr_flag *f)
{
    fputs(*(const int *)((const char *)t + f->off) ? "fast" : "slow", out);
}

static int add_url(void *t, const kvr_flag *f, const char *v, char *err, size_t cap)
{
    (void)f;
    cfg *c = t;
    if (c->nurls == 3) {
        snprintf(err, cap, "too many --url (max 3)");
        return -1;
    }
    c->urls[c->nurls++] = v;
    return 0;
}

#define R(n, t, field, lo, hi)                                                                 \
    {.name = n, .type = KVR_FLAG_##t, .off = offsetof(cfg, field), .min = lo, .max = hi,       \
     .help = "help of " n}
static const kvr_flag table[] = {
    R("name", STR, name, 0, 0),
    R("port", INT, port, 1, 65535),
    R("stall", LONG, stall, -1, 1e9),
    R("blocks", U32, blocks, 1, 1e8),
    R("seed", U64, seed, 0, 1.8e19),
    R("bytes", SIZE, bytes, 64, 1e12),
    R("ratio", DOUBLE, ratio, 0, 1),
    {.name = "mode", .type = KVR_FLAG_CUSTOM, .off = offsetof(cfg, mode), .help = "slow | fast",
     .set = set_mode, .show = show_mode},
    {.name = "url", .type = KVR_FLAG_CUSTOM, .help = "a URL (repeatable)", .set = add_url},
};
#define N (sizeof(table) / sizeof(*table))

static cfg defaults(void)
{
    cfg c = {.name = "x", .port = 8000, .stall = -1, .blocks = 16, .seed = 7, .bytes = 1024,
             .ratio = 0.5};
    return c;
}

static char err[256];

/* Parses a NULL-terminated list of arguments into *c. */
static int parse(cfg *c, ...)
{
    char *argv[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, c);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    err[0] = '\0';
    return kvr_flags_parse(table, N, c, argc, argv, err, sizeof(err));
}

static void both_syntaxes(void **st)
{
    (void)st;
    cfg c = defaults();
    assert_int_equal(parse(&c, "--name", "alpha", "--port=9001", "--stall", "-1", "--blocks=4",
                           "--seed", "18000000000000000001", "--bytes=2048", "--ratio", "0.25",
                           NULL),
                     0);
    assert_string_equal(c.name, "alpha");
    assert_int_equal(c.port, 9001);
    assert_int_equal(c.stall, -1);
    assert_int_equal(c.blocks, 4);
    assert_true(c.seed == 18000000000000000001ull); /* read exactly, not through a double */
    assert_int_equal(c.bytes, 2048);
    assert_true(c.ratio == 0.25);
    /* an empty value after '=' is a value; a later flag wins */
    assert_int_equal(parse(&c, "--name=", "--port", "1", "--port=2", NULL), 0);
    assert_string_equal(c.name, "");
    assert_int_equal(c.port, 2);
    /* exponent notation is the integer it denotes */
    assert_int_equal(parse(&c, "--bytes=1e6", NULL), 0);
    assert_int_equal(c.bytes, 1000000);
}

static void bounds(void **st)
{
    (void)st;
    cfg c = defaults();
    assert_int_equal(parse(&c, "--port", "65535", NULL), 0);
    assert_int_equal(parse(&c, "--port", "1", NULL), 0);
    assert_int_equal(parse(&c, "--port", "0", NULL), -1);
    assert_non_null(strstr(err, "--port: bad value '0'"));
    assert_non_null(strstr(err, "[1, 65535]"));
    assert_int_equal(parse(&c, "--port=65536", NULL), -1);
    assert_int_equal(parse(&c, "--stall=-2", NULL), -1);
    assert_int_equal(parse(&c, "--ratio", "1.5", NULL), -1);
    assert_non_null(strstr(err, "expected a number in [0, 1]"));
    assert_int_equal(parse(&c, "--ratio", "nan", NULL), -1);
    assert_int_equal(parse(&c, "--ratio", "inf", NULL), -1);
    assert_int_equal(parse(&c, "--seed", "19000000000000000000", NULL), -1);
    assert_int_equal(parse(&c, "--bytes", "-64", NULL), -1);
    assert_int_equal(c.port, 1); /* rejected values leave the field alone */
}

static void integers(void **st)
{
    (void)st;
    cfg c = defaults();
    const char *bad[] = {"1.5", "abc", "", "12x", "0.1"};
    const char *names[] = {"--port", "--stall", "--blocks", "--seed", "--bytes"};
    for (size_t n = 0; n < sizeof(names) / sizeof(*names); n++)
        for (size_t k = 0; k < sizeof(bad) / sizeof(*bad); k++) {
            assert_int_equal(parse(&c, names[n], bad[k], NULL), -1);
            assert_non_null(strstr(err, "expected an integer"));
        }
    assert_int_equal(parse(&c, "--ratio", "abc", NULL), -1);
    c = defaults();
    assert_int_equal(parse(&c, "--blocks", "100.0", NULL), 0);
    assert_int_equal(c.blocks, 100);
}

static void unknown_and_missing(void **st)
{
    (void)st;
    cfg c = defaults();
    assert_int_equal(parse(&c, "--nope", "1", NULL), -1);
    assert_string_equal(err, "unknown flag '--nope' (see --help)");
    assert_int_equal(parse(&c, "--por=1", NULL), -1); /* no prefix matching */
    assert_int_equal(parse(&c, "stray", NULL), -1);
    assert_string_equal(err, "unexpected argument 'stray' (see --help)");
    assert_int_equal(parse(&c, "--port", NULL), -1);
    assert_string_equal(err, "--port needs a value");
    assert_int_equal(parse(&c, "--help", NULL), 1);
    assert_int_equal(parse(&c, "--port", "2", "-h", "--nope", NULL), 1);
    assert_int_equal(parse(&c, NULL), 0);
}

static void custom_and_repeatable(void **st)
{
    (void)st;
    cfg c = defaults();
    assert_int_equal(parse(&c, "--mode", "fast", NULL), 0);
    assert_int_equal(c.mode, 1);
    assert_int_equal(parse(&c, "--mode=slow", NULL), 0);
    assert_int_equal(c.mode, 0);
    assert_int_equal(parse(&c, "--mode", "medium", NULL), -1);
    assert_string_equal(err, "--mode: bad value 'medium' (expected slow | fast)");
    assert_int_equal(parse(&c, "--url", "a", "--url=b", "--url", "c", NULL), 0);
    assert_int_equal(c.nurls, 3);
    assert_string_equal(c.urls[0], "a");
    assert_string_equal(c.urls[1], "b");
    assert_string_equal(c.urls[2], "c");
    assert_int_equal(parse(&c, "--url", "d", NULL), -1); /* the callback's own message wins */
    assert_string_equal(err, "too many --url (max 3)");
}

static void usage_shows_defaults(void **st)
{
    (void)st;
    cfg d = defaults();
    d.name = NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    kvr_flags_usage(f, table, N, &d, 10);
    fclose(f);
    assert_non_null(strstr(text, "  --name       help of name [unset]\n"));
    assert_non_null(strstr(text, "  --port       help of port [8000]\n"));
    assert_non_null(strstr(text, "--stall      help of stall [-1]\n"));
    assert_non_null(strstr(text, "help of blocks [16]\n"));
    assert_non_null(strstr(text, "help of seed [7]\n"));
    assert_non_null(strstr(text, "help of bytes [1024]\n"));
    assert_non_null(strstr(text, "help of ratio [0.5]\n"));
    assert_non_null(strstr(text, "--mode       slow | fast [slow]\n"));
    assert_non_null(strstr(text, "--url        a URL (repeatable)\n")); /* no show: no default */
    free(text);

    text = NULL;
    f = open_memstream(&text, &len);
    kvr_flags_usage(f, table, N, NULL, 6);
    fclose(f);
    assert_non_null(strstr(text, "  --port   help of port\n"));
    assert_null(strchr(text, '['));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_syntaxes),
        cmocka_unit_test(bounds),
        cmocka_unit_test(integers),
        cmocka_unit_test(unknown_and_missing),
        cmocka_unit_test(custom_and_repeatable),
        cmocka_unit_test(usage_shows_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
