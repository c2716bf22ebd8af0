/* Traces kvroute-bench replays, in one shape whatever the source format: a list of sessions,
 * each an ordered list of turns (one chat-completions request per turn). Conversation datasets
 * (tau-bench, SWE-agent, ShareGPT, MT-Bench) have one session per conversation and one turn per
 * recorded assistant message; request traces (Mooncake, Azure) have one single-turn session per
 * row. Request bodies are built on demand (kvr_bench_body()), so a trace of 12,000 Mooncake
 * rows does not hold 600 MB of prompts. Field meanings of every source are in
 * ../shared/data/<dataset>/SOURCE.md and data/<dataset>/SOURCE.md. */
#ifndef KVR_BENCH_TRACE_H
#define KVR_BENCH_TRACE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/buf.h"

/** Source formats (`--format`). */
typedef enum kvr_bench_format {
    KVR_BENCH_FMT_TAU,      /**< tau-bench trajectories: {"task_id","trial","messages"} JSONL */
    KVR_BENCH_FMT_SWEAGENT, /**< SWE-agent: {"source_path","messages"} JSONL, is_demo messages */
    KVR_BENCH_FMT_SHAREGPT, /**< ShareGPT: {"id","conversations":[{"from","value"}]} JSONL */
    KVR_BENCH_FMT_MTBENCH,  /**< MT-Bench question.jsonl (+ reference_answer_gpt-4.jsonl) */
    KVR_BENCH_FMT_MOONCAKE, /**< Mooncake: {"timestamp","input_length","output_length","hash_ids"} */
    KVR_BENCH_FMT_AZURE,    /**< Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens */
} kvr_bench_format;

/** Parses a `--format` name ("tau", "sweagent", "sharegpt", "mtbench", "mooncake", "azure").
 *  Returns 0, or -1 for an unknown name. */
int kvr_bench_format_parse(const char *s, kvr_bench_format *out);
/** The `--format` name of `f`. */
const char *kvr_bench_format_name(kvr_bench_format f);
/** True for the conversation formats (sessions of several turns carrying message lists). */
bool kvr_bench_format_is_conversation(kvr_bench_format f);

/** One request of a session. */
typedef struct kvr_bench_turn {
    uint32_t nmsgs;         /**< conversation formats: the request carries the session's first
                                 nmsgs messages (everything before this assistant message) */
    uint32_t answer_tokens; /**< recorded answer length in tokens (Mooncake/Azure: the trace's
                                 output length; conversations: estimated as ceil(bytes / 4) of
                                 the assistant message's text and tool calls); 0 = unknown */
    uint32_t input_tokens;  /**< Mooncake/Azure: prompt length in tokens; 0 for conversations */
    uint32_t nblocks;       /**< Mooncake: number of block ids */
    size_t block_off;       /**< Mooncake: index of the first block id in kvr_bench_trace.blocks */
    int64_t at_ms;          /**< arrival time, ms from the trace's first row; -1 when none */
} kvr_bench_turn;

/** One conversation (or one request-trace row). */
typedef struct kvr_bench_session {
    char *name;            /**< stable id from the trace, e.g. "task12-trial3" (owned) */
    json_t *messages;      /**< OpenAI chat messages, normalised (owned reference); NULL for
                                request traces */
    kvr_bench_turn *turns; /**< owned array of nturns */
    uint32_t nturns;       /**< requests in this session (≥ 1) */
} kvr_bench_session;

/** A loaded trace. All-zero is a valid empty trace; free with kvr_bench_trace_free(). */
typedef struct kvr_bench_trace {
    kvr_bench_format format;     /**< source format */
    kvr_bench_session *sessions; /**< owned array, in trace order */
    size_t nsessions;            /**< sessions loaded */
    size_t sessions_cap;         /**< allocated slots */
    size_t nturns;               /**< requests in all sessions */
    uint64_t *blocks;            /**< Mooncake block ids of every row, back to back (owned) */
    size_t nblocks;              /**< ids stored */
    size_t blocks_cap;           /**< allocated slots */
    bool has_timestamps;         /**< turns carry at_ms (Mooncake, Azure) */
} kvr_bench_trace;

/** Loads `path` (a file, or a dataset folder holding the format's usual file name, e.g.
 *  trajectories.jsonl) into `t`, keeping at most `max_requests` turns (0 = all; a conversation
 *  cut by the limit keeps its first turns). Rows that do not fit the format are skipped with a
 *  warning on stderr rather than aborting the run; a file that cannot be read, or that yields
 *  no request at all, is an error. Returns 0, or -1 with a message in err[errlen]. */
int kvr_bench_trace_load(kvr_bench_trace *t, kvr_bench_format f, const char *path,
                         size_t max_requests, char *err, size_t errlen);
/** Frees everything the trace owns; it is then empty. */
void kvr_bench_trace_free(kvr_bench_trace *t);

/** What a request body needs beyond the trace. */
typedef struct kvr_bench_body_opts {
    const char *model;           /**< "model" field */
    uint32_t max_tokens_cap;     /**< upper bound on max_tokens (0 = none) */
    uint32_t default_max_tokens; /**< max_tokens when the recorded answer length is unknown */
    uint64_t seed;               /**< seed of synthetic text (Mooncake, Azure) */
    bool ignore_eos;             /**< add vLLM's "ignore_eos": true so output_length is honoured */
    uint64_t variant;            /**< 0: the trace as recorded. Otherwise a distinct copy of the
                                      session: conversations get the tag "[copy <variant hex>] "
                                      before the text of their first user message (after any
                                      shared system prompt), request traces synthesise their
                                      text from the seed mixed with it (same sharing between
                                      rows, other bytes) */
} kvr_bench_body_opts;

/** Appends the JSON body of turn `turn` of session `s` to `out`:
 *  {"model","messages","max_tokens","stream":true,"stream_options":{"include_usage":true}}.
 *  Conversation messages are re-sent exactly as recorded (assistant text and tool calls
 *  included); Mooncake prompts are synthesised from block ids, Azure prompts are random text.
 *  max_tokens = the recorded answer length (at least 1), capped. Returns 0, or -1 when `out` is
 *  full or memory ran out. */
int kvr_bench_body(const kvr_bench_trace *t, size_t s, size_t turn, const kvr_bench_body_opts *o,
                   kvr_buf *out);

/** Estimated tokens of an OpenAI message's generated part (content text and tool calls' names
 *  and arguments): ceil(bytes / 4), at least 1. */
uint32_t kvr_bench_estimate_answer_tokens(const json_t *msg);

/* Per-format loaders, called by kvr_bench_trace_load() with the file's bytes (NUL-terminated
 * `text` of `len` bytes); `dir` is the folder of the file, for formats made of several files.
 * Each appends sessions to `t` while t->nturns < max (0 = no limit); same return as
 * kvr_bench_trace_load(). */
/** tau-bench trajectories.jsonl. */
int kvr_bench_load_tau(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                       size_t max, char *err, size_t errlen);
/** SWE-agent trajectories.jsonl. */
int kvr_bench_load_sweagent(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen);
/** ShareGPT conversations.jsonl. */
int kvr_bench_load_sharegpt(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen);
/** MT-Bench question.jsonl (answers from dir/reference_answer_gpt-4.jsonl when present). */
int kvr_bench_load_mtbench(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                           size_t max, char *err, size_t errlen);
/** Mooncake conversation_trace.jsonl. */
int kvr_bench_load_mooncake(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                            size_t max, char *err, size_t errlen);
/** Azure AzureLLMInferenceTrace_*.csv. */
int kvr_bench_load_azure(kvr_bench_trace *t, const char *text, size_t len, const char *dir,
                         size_t max, char *err, size_t errlen);

/* Helpers shared by the loaders. */
/** Appends an empty session named `name` and returns it (NULL when memory ran out). */
kvr_bench_session *kvr_bench_trace_add_session(kvr_bench_trace *t, const char *name);
/** Appends a turn to `s`, counting it in t->nturns; returns it zeroed except at_ms = -1, or NULL
 *  when memory ran out. */
kvr_bench_turn *kvr_bench_session_add_turn(kvr_bench_trace *t, kvr_bench_session *s);
/** Removes the last session if it has no turns (a conversation without assistant message). */
void kvr_bench_trace_drop_empty_tail(kvr_bench_trace *t);
/** Calls fn(line, len, lineno, ud) for each non-blank line of text; stops early when fn returns
 *  non-zero and returns that value, else 0. Lines are not NUL-terminated. */
int kvr_bench_each_line(const char *text, size_t len,
                        int (*fn)(const char *line, size_t n, size_t lineno, void *ud), void *ud);
/** Adds the turns of a conversation session `s` whose messages are set: one per assistant
 *  message for which skip(msg) is false (NULL = none skipped), each carrying the messages before
 *  it, stopping at t->nturns == max (0 = no limit). */
int kvr_bench_conversation_turns(kvr_bench_trace *t, kvr_bench_session *s, size_t max,
                                 bool (*skip)(const json_t *msg));

#endif
