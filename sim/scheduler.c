/* Continuous-batching engine over the KV block pool (see scheduler.h for the vLLM model). */
#include "scheduler.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "timing.h"
#include "tokenizer.h"
#include "util/log.h"
#include "util/time.h"

enum { S_WAITING, S_RUNNING };

struct kvr_sim_seq {
    uint32_t *tokens; /* prompt then output; room for nprompt + max_tokens */
    size_t ntok;      /* known tokens (prompt + sampled) */
    size_t num_computed;
    uint64_t *hashes; /* full-block hashes, computed lazily up to nhash */
    size_t nhash;
    uint32_t *blocks; /* block table */
    size_t nblocks;
    size_t num_cached_blocks; /* leading blocks already in the prefix cache */
    uint64_t gen_seed;
    int state;
    int in_step, aborted, admitted;
    kvr_sim_seq *prev, *next; /* waiting queue */
    kvr_sim_seq_info info;
    kvr_sim_seq_cbs cbs;
    void *ud;
};

typedef struct step_ent {
    kvr_sim_seq *seq;
    size_t n;
} step_ent;

struct kvr_sim_sched {
    uv_loop_t *loop;
    kvr_sim_kv *kv;
    kvr_sim_sched_cfg cfg;
    uint32_t bs;
    kvr_sim_seq **running;
    size_t nrunning;
    kvr_sim_seq *wait_head, *wait_tail;
    size_t nwaiting;
    step_ent *step;
    size_t nstep;
    kvr_sim_step_load load; /* the step being scheduled */
    uint32_t *tmp;
    size_t tmp_cap;
    int busy, closing;
    double model_us, last_cost;
    uint64_t queries, hits, preemptions, steps;
    uv_idle_t idle;
    uv_poll_t tpoll;
    int tfd;
    int open_handles;
};

/* ---- sequences ---- */

static void free_seq(kvr_sim_seq *q)
{
    free(q->tokens);
    free(q->hashes); /* blocks share this allocation */
    free(q);
}

static void wait_unlink(kvr_sim_sched *s, kvr_sim_seq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        s->wait_head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        s->wait_tail = q->prev;
    q->prev = q->next = NULL;
    s->nwaiting--;
}

static void wait_push_back(kvr_sim_sched *s, kvr_sim_seq *q)
{
    q->state = S_WAITING;
    q->next = NULL;
    q->prev = s->wait_tail;
    if (s->wait_tail)
        s->wait_tail->next = q;
    else
        s->wait_head = q;
    s->wait_tail = q;
    s->nwaiting++;
}

static void wait_push_front(kvr_sim_sched *s, kvr_sim_seq *q)
{
    q->state = S_WAITING;
    q->prev = NULL;
    q->next = s->wait_head;
    if (s->wait_head)
        s->wait_head->prev = q;
    else
        s->wait_tail = q;
    s->wait_head = q;
    s->nwaiting++;
}

static void running_remove(kvr_sim_sched *s, kvr_sim_seq *q)
{
    for (size_t i = 0; i < s->nrunning; i++)
        if (s->running[i] == q) {
            memmove(&s->running[i], &s->running[i + 1],
                    (s->nrunning - i - 1) * sizeof(*s->running));
            s->nrunning--;
            return;
        }
}

static void release_blocks(kvr_sim_sched *s, kvr_sim_seq *q)
{
    kvr_sim_kv_release(s->kv, q->blocks, q->nblocks);
    q->nblocks = 0;
    q->num_cached_blocks = 0;
}

/* Removes a sequence from wherever it is and frees it; no callbacks. */
static void finalize(kvr_sim_sched *s, kvr_sim_seq *q)
{
    if (q->state == S_WAITING)
        wait_unlink(s, q);
    else
        running_remove(s, q);
    release_blocks(s, q);
    free_seq(q);
}

static void ensure_hashes(kvr_sim_sched *s, kvr_sim_seq *q, size_t upto)
{
    for (size_t i = q->nhash; i < upto; i++) {
        uint64_t parent = i ? q->hashes[i - 1] : kvr_sim_kv_root_hash(s->kv);
        q->hashes[i] = kvr_sim_kv_hash_block(s->kv, parent, q->tokens + i * s->bs);
    }
    if (upto > q->nhash)
        q->nhash = upto;
}

/* vLLM's allocate_slots(): room for `num_new` more tokens after num_computed (which already
 * includes the `nhit` cached blocks in `hit`), then cache_blocks(). Returns 0 or -1. */
static int allocate(kvr_sim_sched *s, kvr_sim_seq *q, size_t num_new, const uint32_t *hit,
                    size_t nhit)
{
    size_t total = q->num_computed + num_new;
    size_t required = (total + s->bs - 1) / s->bs;
    size_t have = q->nblocks + nhit;
    size_t need = required > have ? required - have : 0;
    size_t evictable = nhit ? kvr_sim_kv_count_free(s->kv, hit, nhit) : 0;
    if (need + evictable > kvr_sim_kv_num_free(s->kv))
        return -1;
    if (nhit) {
        kvr_sim_kv_touch(s->kv, hit, nhit);
        memcpy(q->blocks + q->nblocks, hit, nhit * sizeof(*hit));
        q->nblocks += nhit;
        q->num_cached_blocks = q->nblocks;
    }
    if (need) {
        kvr_sim_kv_alloc(s->kv, need, q->blocks + q->nblocks);
        q->nblocks += need;
    }
    size_t upto = (total < q->ntok ? total : q->ntok) / s->bs;
    if (upto > q->num_cached_blocks) {
        size_t c = q->num_cached_blocks;
        ensure_hashes(s, q, upto);
        kvr_sim_kv_cache(s->kv, q->blocks + c, q->hashes + c, upto - c, c > 0,
                         c ? q->hashes[c - 1] : 0, q->tokens + c * s->bs);
        q->num_cached_blocks = upto;
    }
    return 0;
}

static void preempt(kvr_sim_sched *s, kvr_sim_seq *q)
{
    release_blocks(s, q);
    q->num_computed = 0;
    q->info.preemptions++;
    s->preemptions++;
    wait_push_front(s, q);
}

static void add_to_step(kvr_sim_sched *s, kvr_sim_seq *q, size_t n)
{
    s->step[s->nstep].seq = q;
    s->step[s->nstep].n = n;
    s->nstep++;
    q->in_step = 1;
    if (n == 1 && q->info.output_tokens > 0 && q->num_computed + 1 == q->ntok) {
        s->load.decode_seqs++;
        s->load.decode_kv_tokens += q->ntok; /* attends to its whole context */
    } else {
        s->load.prefill_tokens += n;
    }
}

/* vLLM's Scheduler.schedule() for the FCFS policy. Returns the number of sequences in the step. */
static size_t schedule(kvr_sim_sched *s)
{
    size_t budget = s->cfg.max_num_batched_tokens;
    int preempted = 0;
    s->nstep = 0;
    s->load = (kvr_sim_step_load){0};
    for (size_t i = 0; i < s->nrunning && budget > 0; i++) {
        kvr_sim_seq *q = s->running[i];
        size_t n = q->ntok - q->num_computed;
        if (n > budget)
            n = budget;
        int ok = 1;
        while (allocate(s, q, n, NULL, 0) < 0) {
            kvr_sim_seq *victim = s->running[--s->nrunning];
            preempt(s, victim);
            preempted = 1;
            if (victim == q) {
                ok = 0;
                break;
            }
        }
        if (!ok)
            break;
        add_to_step(s, q, n);
        budget -= n;
    }
    while (!preempted && s->wait_head && budget > 0 && s->nrunning < s->cfg.max_num_seqs) {
        kvr_sim_seq *q = s->wait_head;
        size_t nhit = 0;
        /* At least one token must be computed to sample from, so the last prompt token is
         * never a hit (vLLM's max_cache_hit_length = num_tokens - 1). */
        size_t max_hit = (q->ntok - 1) / s->bs;
        if (max_hit > s->tmp_cap) {
            uint32_t *p = realloc(s->tmp, max_hit * sizeof(*p));
            if (p) {
                s->tmp = p;
                s->tmp_cap = max_hit;
            }
        }
        if (max_hit <= s->tmp_cap) {
            ensure_hashes(s, q, max_hit);
            nhit = kvr_sim_kv_longest_hit(s->kv, q->hashes, max_hit, s->tmp);
        }
        q->num_computed = nhit * s->bs;
        size_t n = q->ntok - q->num_computed;
        if (n > budget)
            n = budget;
        if (allocate(s, q, n, s->tmp, nhit) < 0) {
            q->num_computed = 0;
            break;
        }
        wait_unlink(s, q);
        q->state = S_RUNNING;
        s->running[s->nrunning++] = q;
        if (!q->admitted) {
            q->admitted = 1;
            q->info.cached_tokens = q->num_computed;
            q->info.admitted_ns = kvr_now_ns();
            s->queries += q->info.prompt_tokens;
            s->hits += q->num_computed;
        }
        add_to_step(s, q, n);
        budget -= n;
    }
    return s->nstep;
}

static double step_cost(const kvr_sim_sched *s)
{
    kvr_sim_timing t = {.step_overhead_us = s->cfg.step_overhead_us,
                        .prefill_us_per_token = s->cfg.prefill_us_per_token,
                        .decode_us_per_token = s->cfg.decode_us_per_token,
                        .decode_us_per_kv_token = s->cfg.decode_us_per_kv_token};
    return kvr_sim_step_cost_us(&t, &s->load);
}

/* vLLM's update_from_output(): the step's tokens are computed; sample, deliver, finish. */
static void complete_step(kvr_sim_sched *s)
{
    s->model_us += s->last_cost;
    s->steps++;
    uint64_t now = kvr_now_ns();
    for (size_t i = 0; i < s->nstep; i++) {
        kvr_sim_seq *q = s->step[i].seq;
        if (q->aborted) {
            finalize(s, q);
            continue;
        }
        q->num_computed += s->step[i].n;
        if (q->num_computed < q->ntok) {
            q->in_step = 0; /* a prefill chunk: nothing to sample yet */
            continue;
        }
        size_t idx = q->info.output_tokens;
        uint32_t id = kvr_sim_gen_token(q->gen_seed, idx, NULL, NULL);
        q->tokens[q->ntok++] = id;
        q->info.output_tokens++;
        if (idx == 0) {
            q->info.first_token_ns = now;
            q->info.first_token_model_us = s->model_us;
        }
        int last = q->info.output_tokens >= q->info.max_tokens;
        if (q->cbs.on_token)
            q->cbs.on_token(q->ud, q, id, idx, last);
        q->in_step = 0;
        if (q->aborted) {
            finalize(s, q);
            continue;
        }
        if (last) {
            running_remove(s, q);
            release_blocks(s, q);
            if (q->cbs.on_finish)
                q->cbs.on_finish(q->ud, q);
            free_seq(q);
        }
    }
    s->nstep = 0;
    if (s->cfg.on_step_done)
        s->cfg.on_step_done(s->cfg.ud);
}

static void start_step(kvr_sim_sched *s);

static void on_idle(uv_idle_t *h)
{
    kvr_sim_sched *s = h->data;
    uv_idle_stop(&s->idle);
    complete_step(s); /* still busy: a submit from a callback must not start a step */
    s->busy = 0;
    start_step(s);
}

static void on_timer(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    kvr_sim_sched *s = h->data;
    uint64_t expirations;
    if (read(s->tfd, &expirations, sizeof(expirations)) < 0 && errno == EAGAIN)
        return; /* spurious wake-up */
    complete_step(s);
    s->busy = 0;
    start_step(s);
}

static void start_step(kvr_sim_sched *s)
{
    if (s->busy || s->closing || !s->loop)
        return;
    size_t n = schedule(s);
    if (n == 0 && s->nwaiting)
        n = schedule(s); /* a step that only preempted admits nothing; the next one will */
    if (n == 0)
        return;
    s->busy = 1;
    s->last_cost = step_cost(s);
    double ns = s->last_cost * 1000.0 * s->cfg.time_scale;
    if (ns < 1.0) {
        uv_idle_start(&s->idle, on_idle);
        return;
    }
    struct itimerspec its = {0};
    its.it_value.tv_sec = (time_t)(ns / 1e9);
    its.it_value.tv_nsec = (long)(ns - (double)its.it_value.tv_sec * 1e9);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    if (timerfd_settime(s->tfd, 0, &its, NULL) < 0)
        uv_idle_start(&s->idle, on_idle); /* cannot happen with valid values; never stall */
}

/* ---- public API ---- */

kvr_sim_sched *kvr_sim_sched_new(uv_loop_t *loop, kvr_sim_kv *kv, const kvr_sim_sched_cfg *cfg)
{
    kvr_sim_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->loop = loop;
    s->kv = kv;
    s->cfg = *cfg;
    if (s->cfg.max_num_seqs == 0)
        s->cfg.max_num_seqs = 1;
    if (s->cfg.max_num_batched_tokens == 0)
        s->cfg.max_num_batched_tokens = 1;
    s->bs = kvr_sim_kv_block_size(kv);
    s->tfd = -1;
    s->running = calloc(s->cfg.max_num_seqs, sizeof(*s->running));
    s->step = calloc(s->cfg.max_num_seqs, sizeof(*s->step));
    if (!s->running || !s->step)
        goto fail;
    if (loop) {
        s->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (s->tfd < 0)
            goto fail;
        uv_idle_init(loop, &s->idle);
        s->idle.data = s;
        uv_poll_init(loop, &s->tpoll, s->tfd);
        s->tpoll.data = s;
        uv_poll_start(&s->tpoll, UV_READABLE, on_timer);
        s->open_handles = 2;
    }
    return s;
fail:
    free(s->running);
    free(s->step);
    free(s);
    return NULL;
}

static void destroy(kvr_sim_sched *s)
{
    if (s->tfd >= 0)
        close(s->tfd);
    free(s->running);
    free(s->step);
    free(s->tmp);
    free(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    kvr_sim_sched *s = h->data;
    if (--s->open_handles == 0)
        destroy(s);
}

void kvr_sim_sched_close(kvr_sim_sched *s)
{
    if (!s)
        return;
    s->closing = 1;
    for (size_t i = 0; i < s->nstep; i++)
        s->step[i].seq->in_step = 0;
    s->nstep = 0;
    while (s->nrunning)
        finalize(s, s->running[s->nrunning - 1]);
    while (s->wait_head)
        finalize(s, s->wait_head);
    if (!s->loop) {
        destroy(s);
        return;
    }
    uv_close((uv_handle_t *)&s->idle, on_handle_closed);
    uv_poll_stop(&s->tpoll);
    uv_close((uv_handle_t *)&s->tpoll, on_handle_closed);
}

int kvr_sim_sched_fits(const kvr_sim_sched *s, size_t total_tokens)
{
    return (total_tokens + s->bs - 1) / s->bs <= kvr_sim_kv_num_blocks(s->kv);
}

kvr_sim_seq *kvr_sim_sched_submit(kvr_sim_sched *s, uint32_t *tokens, size_t ntok,
                                  size_t max_tokens, const kvr_sim_seq_cbs *cbs, void *ud)
{
    kvr_sim_seq *q = calloc(1, sizeof(*q));
    size_t nb = (ntok + max_tokens) / s->bs + 1;
    /* hashes (u64) and the block table (u32) in one allocation */
    void *mem = q ? malloc(nb * (sizeof(uint64_t) + sizeof(uint32_t))) : NULL;
    if (!q || !mem || ntok == 0 || s->closing) {
        free(q);
        free(mem);
        free(tokens);
        return NULL;
    }
    q->tokens = tokens;
    q->ntok = ntok;
    q->hashes = mem;
    q->blocks = (uint32_t *)(q->hashes + nb);
    q->gen_seed = XXH3_64bits_withSeed(tokens, ntok * sizeof(uint32_t), s->cfg.seed);
    q->info.prompt_tokens = ntok;
    q->info.max_tokens = max_tokens ? max_tokens : 1;
    q->info.arrival_ns = kvr_now_ns();
    q->info.arrival_model_us = s->model_us;
    if (cbs)
        q->cbs = *cbs;
    q->ud = ud;
    wait_push_back(s, q);
    start_step(s);
    return q;
}

void kvr_sim_sched_abort(kvr_sim_sched *s, kvr_sim_seq *q)
{
    if (!q || q->aborted)
        return;
    q->aborted = 1;
    if (!q->in_step)
        finalize(s, q);
}

const kvr_sim_seq_info *kvr_sim_seq_get_info(const kvr_sim_seq *q)
{
    return &q->info;
}

uint64_t kvr_sim_seq_gen_seed(const kvr_sim_seq *q)
{
    return q->gen_seed;
}

size_t kvr_sim_sched_step(kvr_sim_sched *s)
{
    if (s->loop || s->closing)
        return 0;
    size_t n = schedule(s);
    if (n == 0 && s->nwaiting)
        n = schedule(s);
    if (n == 0)
        return 0;
    s->last_cost = step_cost(s);
    complete_step(s);
    return n;
}

const kvr_sim_sched_cfg *kvr_sim_sched_get_cfg(const kvr_sim_sched *s)
{
    return &s->cfg;
}

double kvr_sim_sched_last_cost_us(const kvr_sim_sched *s)
{
    return s->last_cost;
}
double kvr_sim_sched_model_us(const kvr_sim_sched *s)
{
    return s->model_us;
}
size_t kvr_sim_sched_num_running(const kvr_sim_sched *s)
{
    return s->nrunning;
}
size_t kvr_sim_sched_num_waiting(const kvr_sim_sched *s)
{
    return s->nwaiting;
}
uint64_t kvr_sim_sched_cache_queries(const kvr_sim_sched *s)
{
    return s->queries;
}
uint64_t kvr_sim_sched_cache_hits(const kvr_sim_sched *s)
{
    return s->hits;
}
uint64_t kvr_sim_sched_preemptions(const kvr_sim_sched *s)
{
    return s->preemptions;
}
uint64_t kvr_sim_sched_steps(const kvr_sim_sched *s)
{
    return s->steps;
}
