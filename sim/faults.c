/* Fault settings and their run-time updates. */
#include "faults.h"

#include <math.h>

#include "util/rand.h"

void kvr_sim_faults_default(kvr_sim_faults *f)
{
    f->fail_rate = 0;
    f->fail_status = 500;
    f->delay_ms = 0;
    f->stall_after_events = -1;
    f->drop_after_events = -1;
    f->health_status = 200;
    f->drop_event_batches = 0;
    f->replay_silent = 0;
    f->kv_params_drop_rate = 0;
    f->kv_transfer_fail_rate = 0;
}

int kvr_sim_faults_draw(double rate)
{
    return rate > 0 && kvr_rand_double() < rate;
}

int kvr_sim_faults_should_fail(const kvr_sim_faults *f)
{
    return kvr_sim_faults_draw(f->fail_rate);
}

static int get_num(const json_t *obj, const char *k, double lo, double hi, double *out,
                   int *present)
{
    const json_t *v = json_object_get(obj, k);
    *present = v != NULL;
    if (!v)
        return 0;
    if (!json_is_number(v))
        return -1;
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return -1;
    *out = d;
    return 0;
}

int kvr_sim_faults_update(kvr_sim_faults *f, const json_t *obj, const char **err)
{
    if (!json_is_object(obj)) {
        *err = "the body must be a JSON object";
        return -1;
    }
    kvr_sim_faults n = *f;
    double d;
    int p;
    if (get_num(obj, "fail_rate", 0, 1, &d, &p) < 0)
        goto bad;
    if (p)
        n.fail_rate = d;
    if (get_num(obj, "fail_status", 100, 599, &d, &p) < 0)
        goto bad;
    if (p)
        n.fail_status = (int)d;
    if (get_num(obj, "delay_ms", 0, 86400000, &d, &p) < 0)
        goto bad;
    if (p)
        n.delay_ms = (uint64_t)d;
    if (get_num(obj, "stall_after_events", -1, 1e9, &d, &p) < 0)
        goto bad;
    if (p)
        n.stall_after_events = (long)d;
    if (get_num(obj, "drop_after_events", -1, 1e9, &d, &p) < 0)
        goto bad;
    if (p)
        n.drop_after_events = (long)d;
    if (get_num(obj, "health_status", 100, 599, &d, &p) < 0)
        goto bad;
    if (p)
        n.health_status = (int)d;
    if (get_num(obj, "drop_event_batches", 0, 1e9, &d, &p) < 0 || (p && d != floor(d)))
        goto bad;
    if (p)
        n.drop_event_batches = (long)d;
    const json_t *rs = json_object_get(obj, "replay_silent");
    if (rs && !json_is_boolean(rs))
        goto bad;
    if (rs)
        n.replay_silent = json_is_true(rs);
    if (get_num(obj, "kv_params_drop_rate", 0, 1, &d, &p) < 0)
        goto bad;
    if (p)
        n.kv_params_drop_rate = d;
    if (get_num(obj, "kv_transfer_fail_rate", 0, 1, &d, &p) < 0)
        goto bad;
    if (p)
        n.kv_transfer_fail_rate = d;
    *f = n;
    return 0;
bad:
    *err = "fault fields: fail_rate in [0,1], fail_status and health_status in [100,599], "
           "delay_ms >= 0, stall_after_events and drop_after_events >= -1, "
           "drop_event_batches an integer >= 0, replay_silent a boolean, kv_params_drop_rate and "
           "kv_transfer_fail_rate in [0,1]";
    return -1;
}

json_t *kvr_sim_faults_json(const kvr_sim_faults *f)
{
    return json_pack("{s:f,s:i,s:I,s:I,s:I,s:i,s:I,s:b,s:f,s:f}", "fail_rate", f->fail_rate,
                     "fail_status", f->fail_status, "delay_ms", (json_int_t)f->delay_ms,
                     "stall_after_events", (json_int_t)f->stall_after_events,
                     "drop_after_events", (json_int_t)f->drop_after_events, "health_status",
                     f->health_status, "drop_event_batches", (json_int_t)f->drop_event_batches,
                     "replay_silent", f->replay_silent, "kv_params_drop_rate",
                     f->kv_params_drop_rate, "kv_transfer_fail_rate", f->kv_transfer_fail_rate);
}
