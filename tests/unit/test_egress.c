/* Egress policy: CIDR and address rules for IPv4/IPv6 (mapped IPv4 included), host globs,
 * deny over allow, an empty allow list, load-time judgement of names, malformed entries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include <cmocka.h>

#include "upstream/egress.h"

static struct sockaddr_storage addr(const char *ip)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        inet_pton(AF_INET6, ip, &a->sin6_addr);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        inet_pton(AF_INET, ip, &a->sin_addr);
    }
    return ss;
}

static int at(const kvr_egress *e, const char *host, const char *ip)
{
    char why[128];
    struct sockaddr_storage ss = addr(ip);
    return kvr_egress_check_addr(e, host, (struct sockaddr *)&ss, why, sizeof(why));
}

static void test_deny_cidrs(void **state)
{
    (void)state;
    kvr_errlist errs = {0};
    const char *deny[] = {"10.0.0.0/8", "fd00::/8", "169.254.169.254"};
    kvr_egress *e = kvr_egress_new(NULL, 0, deny, 3, "f", &errs);
    assert_int_equal(errs.n, 0);
    char why[128];
    assert_int_equal(kvr_egress_check_url(e, "http://10.1.2.3:8000", why, sizeof(why)), 0);
    assert_string_equal(why, "deny 10.0.0.0/8");
    assert_int_equal(kvr_egress_check_url(e, "http://11.0.0.1:8000", why, sizeof(why)), 1);
    assert_int_equal(kvr_egress_check_url(e, "http://[fd12::1]:80/x", why, sizeof(why)), 0);
    /* a name passes at load; its address decides at connect time */
    assert_int_equal(kvr_egress_check_url(e, "http://worker.local:8000", why, sizeof(why)), 1);
    assert_int_equal(at(e, "worker.local", "10.9.9.9"), 0);
    assert_int_equal(at(e, "worker.local", "::ffff:10.9.9.9"), 0); /* mapped IPv4 */
    assert_int_equal(at(e, "worker.local", "192.0.2.1"), 1);
    assert_int_equal(at(e, NULL, "169.254.169.254"), 0);
    kvr_egress_free(e);
}

static void test_allow_lists_and_globs(void **state)
{
    (void)state;
    kvr_errlist errs = {0};
    const char *allow[] = {"127.0.0.0/8", "*.gpu.internal"};
    const char *deny[] = {"bad.gpu.internal"};
    kvr_egress *e = kvr_egress_new(allow, 2, deny, 1, "f", &errs);
    char why[128];
    assert_int_equal(kvr_egress_check_url(e, "http://127.0.0.1:1", why, sizeof(why)), 1);
    assert_int_equal(kvr_egress_check_url(e, "http://192.0.2.1:1", why, sizeof(why)), 0);
    assert_string_equal(why, "not in the allow list");
    assert_int_equal(kvr_egress_check_url(e, "http://A.GPU.internal:1", why, sizeof(why)), 1);
    assert_int_equal(kvr_egress_check_url(e, "http://bad.gpu.internal", why, sizeof(why)), 0);
    /* deny wins even when an allow rule matches the address */
    assert_int_equal(at(e, "bad.gpu.internal", "127.0.0.1"), 0);
    /* a name matching no allow glob may still resolve into an allowed range */
    assert_int_equal(kvr_egress_check_url(e, "http://other:1", why, sizeof(why)), 1);
    assert_int_equal(at(e, "other", "127.0.0.5"), 1);
    assert_int_equal(at(e, "other", "192.0.2.5"), 0);
    kvr_egress_free(e);
    /* with only globs allowed, an unmatched name is refused at load */
    const char *globs[] = {"*.internal"};
    e = kvr_egress_new(globs, 1, NULL, 0, "f", &errs);
    assert_int_equal(kvr_egress_check_url(e, "http://example.com", why, sizeof(why)), 0);
    kvr_egress_free(e);
    kvr_errlist_free(&errs);
}

static void test_malformed(void **state)
{
    (void)state;
    kvr_errlist errs = {0};
    const char *bad[] = {"10.0.0.0/33", "300.1.1.1", "", "fd00::/129", "ok.example"};
    kvr_egress *e = kvr_egress_new(bad, 5, NULL, 0, "F:1:2", &errs);
    assert_int_equal(errs.n, 4);
    assert_non_null(strstr(errs.msg[0], "F:1:2: egress.allow: '10.0.0.0/33'"));
    assert_true(kvr_egress_active(e));
    kvr_egress_free(e);
    kvr_errlist_free(&errs);
    e = kvr_egress_new(NULL, 0, NULL, 0, NULL, &errs);
    assert_false(kvr_egress_active(e));
    char why[8];
    assert_int_equal(kvr_egress_check_url(e, "http://10.0.0.1", why, sizeof(why)), 1);
    kvr_egress_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deny_cidrs),
        cmocka_unit_test(test_allow_lists_and_globs),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
