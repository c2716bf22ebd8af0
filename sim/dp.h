/* kvroute-sim data parallelism: which rank serves a request. vLLM's API server in front of a
 * data-parallel engine (--data-parallel-size N) reads the `X-data-parallel-rank` header
 * (vllm/entrypoints/openai/serving_engine.py, _get_data_parallel_rank) and hands the request to
 * that rank; without it the sim goes round robin over the ranks (vLLM balances by load
 * instead; round robin keeps a header-less client's placement predictable). */
#ifndef KVR_SIM_DP_H
#define KVR_SIM_DP_H
#include <stddef.h>

/** The header a client (or kvroute's rank-aware routing) names the rank with. */
#define KVR_SIM_DP_HEADER "x-data-parallel-rank"

/** Rank selection state: `nranks` ranks (>= 1), the round-robin cursor. */
typedef struct kvr_sim_dp {
    size_t nranks;
    size_t next; /**< the rank the next header-less request gets */
} kvr_sim_dp;

/** The rank for a request whose header value is `hdr` (NULL when absent): the header's decimal
 *  integer (blanks around it allowed, as Python's int()), else the round-robin cursor, which
 *  then moves on. Returns the rank, or -1 with a message in `err` (an OpenAI 400) when the
 *  value is not an integer or not in [0, nranks). The cursor moves only for header-less
 *  requests. */
long kvr_sim_dp_pick(kvr_sim_dp *d, const char *hdr, char *err, size_t cap);

#endif
