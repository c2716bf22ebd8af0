/* A bounded ring of JSON entries. */
#include "reqlog.h"

#include <stdlib.h>

struct kvr_sim_reqlog {
    json_t **e;
    size_t max, head, n;
};

kvr_sim_reqlog *kvr_sim_reqlog_new(size_t max)
{
    kvr_sim_reqlog *l = calloc(1, sizeof(*l));
    if (l && max && !(l->e = calloc(max, sizeof(*l->e)))) {
        free(l);
        return NULL;
    }
    if (l)
        l->max = max;
    return l;
}

void kvr_sim_reqlog_clear(kvr_sim_reqlog *l)
{
    for (size_t i = 0; i < l->n; i++)
        json_decref(l->e[(l->head + i) % l->max]);
    l->head = l->n = 0;
}

void kvr_sim_reqlog_free(kvr_sim_reqlog *l)
{
    if (!l)
        return;
    kvr_sim_reqlog_clear(l);
    free(l->e);
    free(l);
}

void kvr_sim_reqlog_add(kvr_sim_reqlog *l, json_t *entry)
{
    if (!l->max || !entry)
        return;
    if (l->n == l->max) {
        json_decref(l->e[l->head]);
        l->head = (l->head + 1) % l->max;
        l->n--;
    }
    l->e[(l->head + l->n) % l->max] = json_incref(entry);
    l->n++;
}

json_t *kvr_sim_reqlog_list(const kvr_sim_reqlog *l)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < l->n; i++)
        if (json_array_append(a, l->e[(l->head + i) % l->max]) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}
