"""Precise routing from vLLM KV events (issue 13): kvroute-sim workers publish vLLM-format KV
events over ZeroMQ; kvroute's `precise` policy routes by what those events say each worker
holds, per worker trust states repair gaps and restarts, and both cache-aware policies export
their prediction error. Real processes on loopback, bounded in time."""
import concurrent.futures
import json
import time

import httpx
import pytest
import zmq

from conftest import SIM_MODEL, free_port, wait_until

PROMPT_WORDS = 400  # ~400 tokens: 25 blocks of 16


def long_text(tag, n=PROMPT_WORDS):
    return " ".join("%s%d" % (tag, i) for i in range(n))


def convo(tag, user="hi"):
    return [{"role": "system", "content": long_text(tag)}, {"role": "user", "content": user}]


def sim_with_events(sim_factory, *extra):
    pub, rep = free_port(), free_port()
    s = sim_factory("--time-scale", "0", "--kv-events-bind", "bind",
                    "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                    "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep, *extra)
    s.pub, s.rep = pub, rep
    return s


def events_flags(sims):
    out = []
    for s in sims:
        out += ["--kv-events", "%s=tcp://127.0.0.1:%d,tcp://127.0.0.1:%d" % (s.url, s.pub, s.rep)]
    return out


def router(kvroute, sims, policy="precise", extra=(), events=True):
    return kvroute(sims, model=SIM_MODEL, policy=policy, health_interval_ms=0,
                   extra=(events_flags(sims) if events else []) + list(extra))


def state(kv, s):
    return kv.metrics().get("kvroute_kv_events_state", worker=s.url)


def wait_exact(kv, sims, timeout=10):
    for s in sims:
        wait_until(lambda: kv.metrics().find("kvroute_kv_events_state", worker=s.url) and
                   state(kv, s) == 0, timeout, interval=0.05,
                   what="worker %s's KV events exact" % s.url)


def blocks(kv, s):
    return kv.metrics().get("kvroute_kv_blocks", worker=s.url, medium="GPU")


def chat_via(kv, messages, headers=None, max_tokens=4):
    r = kv.post("/v1/chat/completions",
                {"model": SIM_MODEL, "messages": messages, "max_tokens": max_tokens},
                headers=headers)
    assert r.status_code == 200, r.text
    return r


def direct(sim, messages, max_tokens=4):
    return sim.chat(messages, max_tokens=max_tokens)


def restart_sim(sim_factory, old):
    """The same worker (URL and event ports) as a fresh process: seq starts at 0 again."""
    old.stop()
    pub, rep, port = old.pub, old.rep, old.port
    for _ in range(50):
        try:
            s = sim_factory("--port", str(port), "--time-scale", "0", "--kv-events-bind", "bind",
                            "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                            "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep)
            s.pub, s.rep = pub, rep
            return s
        except RuntimeError:
            time.sleep(0.1)  # the old process's ports may linger for a moment
    raise RuntimeError("could not restart the sim on port %d" % port)


# ============================================================================ routing
def test_direct_prefix_routed_exact_where_cache_aware_cannot_know(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory)
    kv = router(kvroute, [a, b])
    ca = router(kvroute, [a, b], policy="cache_aware", events=False)
    wait_exact(kv, [a, b])
    msgs = convo("direct")
    direct(b, msgs)  # not through kvroute: only B's events can tell
    wait_until(lambda: blocks(kv, b) >= 20, 5, what="B's stored blocks in kvroute's index")
    for _ in range(3):
        r = chat_via(kv, msgs)
        assert r.headers["x-kvroute-worker"] == b.url, r.headers
        assert r.headers["x-kvroute-decision"] == "kv_match", r.headers
        assert r.headers["x-kvroute-index"] == "exact", r.headers
        assert float(r.headers["x-kvroute-match"]) >= 0.9, r.headers
    r = chat_via(ca, convo("direct"))
    assert r.headers["x-kvroute-decision"] == "low_match_min_load", r.headers
    assert r.headers["x-kvroute-index"] == "approximate", r.headers
    # /debug/route needs the admin port; the decision is visible through /workers too
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="precise", decision="kv_match") == 3
    assert m.get("kvroute_kv_events_total", worker=b.url, type="BlockStored") >= 1
    assert m.get("kvroute_tokenize_total", source="worker") >= 1


def test_evicted_prefix_is_not_sent_there_any_more(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory)
    kv = router(kvroute, [a, b], extra=["--kv-speculative-ms", "0"])
    wait_exact(kv, [a, b])
    msgs = convo("evict")
    direct(b, msgs)
    wait_until(lambda: blocks(kv, b) >= 20, 5, what="B's blocks indexed")
    assert chat_via(kv, msgs).headers["x-kvroute-decision"] == "kv_match"
    r = b.client.post("/sim/evict")
    assert r.status_code == 200 and r.json()["evicted"] >= 20, r.text
    wait_until(lambda: blocks(kv, b) == 0, 5, what="B's blocks removed from the index")
    assert kv.metrics().get("kvroute_kv_events_total", worker=b.url, type="BlockRemoved") >= 20
    r = chat_via(kv, msgs)
    assert r.headers["x-kvroute-decision"] == "low_match_min_load", r.headers


def test_restart_clears_the_workers_entries(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory)
    kv = router(kvroute, [a, b])
    wait_exact(kv, [a, b])
    direct(b, convo("restart"))
    wait_until(lambda: blocks(kv, b) >= 20, 5, what="B's blocks indexed")
    one = blocks(kv, b)  # one conversation's blocks
    direct(b, convo("restart2"))
    wait_until(lambda: blocks(kv, b) >= 2 * one - 2, 5, what="B's second prompt indexed")
    b2 = restart_sim(sim_factory, b)
    direct(b2, [{"role": "user", "content": "short"}])  # seq 0 again
    direct(b2, convo("after"))
    seen = []
    want = len(b2.tokenize(messages=convo("after"))) // 16  # its full prompt blocks

    def cleared():
        seen[:] = [state(kv, b2), blocks(kv, b2), want]
        return seen[0] == 0 and want <= seen[1] <= want + 1  # + a block filled by decoding
    try:
        wait_until(cleared, 10, interval=0.05,
                   what="B's old entries cleared, its new ones indexed, state exact")
    except AssertionError as e:
        raise AssertionError("%s: (state, blocks, blocks of the new prompt) = %r" % (e, seen))
    r = chat_via(kv, convo("restart"))
    assert r.headers["x-kvroute-decision"] != "kv_match", r.headers
    r = chat_via(kv, convo("after"))
    assert r.headers["x-kvroute-worker"] == b2.url and \
        r.headers["x-kvroute-decision"] == "kv_match", r.headers


def test_dropped_batch_is_replayed_and_state_returns_exact(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory)
    kv = router(kvroute, [a, b])
    wait_exact(kv, [a, b])
    b.faults(drop_event_batches=1)
    direct(b, convo("lost"))      # its batch never reaches the SUB socket
    direct(b, convo("next"))      # the next one shows the gap
    wait_until(lambda: kv.metrics().get("kvroute_kv_events_gaps_total", worker=b.url) >= 1, 5,
               what="the gap seen")
    wait_until(lambda: state(kv, b) == 0 and
               kv.metrics().get("kvroute_kv_events_replays_total", worker=b.url,
                                result="ok") >= 2, 10,
               what="a replay repaired it (the first replay is the one at connect)")
    r = chat_via(kv, convo("lost"))
    assert r.headers["x-kvroute-worker"] == b.url and \
        r.headers["x-kvroute-decision"] == "kv_match", r.headers
    assert state(kv, a) == 0


def test_unreachable_events_fall_back_for_that_worker_only(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_factory("--time-scale", "0")
    nowhere = free_port()
    kv = kvroute([a, b], model=SIM_MODEL, policy="precise", health_interval_ms=0,
                 extra=events_flags([a]) + [
                     "--kv-events", "%s=tcp://127.0.0.1:%d,tcp://127.0.0.1:%d" % (
                         b.url, nowhere, free_port())])
    t0 = time.monotonic()
    wait_until(lambda: state(kv, b) == 2, 10, interval=0.1, what="B in fallback")
    assert time.monotonic() - t0 < 10
    assert state(kv, a) == 0
    # B is routed approximately; kvroute keeps serving
    msgs = convo("fallback")
    direct(a, msgs)
    wait_until(lambda: blocks(kv, a) >= 20, 5, what="A's blocks")
    r = chat_via(kv, msgs)
    assert r.headers["x-kvroute-worker"] == a.url and \
        r.headers["x-kvroute-index"] == "exact", r.headers


def test_unanswered_replay_falls_back_within_10s_and_recovers(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory, "--replay-silent")
    kv = router(kvroute, [a, b])
    t0 = time.monotonic()
    wait_until(lambda: state(kv, b) == 2, 10, interval=0.1, what="B in fallback")
    assert time.monotonic() - t0 < 10
    assert kv.metrics().get("kvroute_kv_events_replays_total", worker=b.url,
                            result="timeout") >= 1
    assert state(kv, a) == 0
    b.faults(replay_silent=False)  # kvroute keeps retrying in the background
    wait_until(lambda: state(kv, b) == 0, 15, interval=0.1, what="B exact again")


def test_lost_batches_older_than_the_replay_buffer(sim_factory, kvroute):
    """Batches lost from the stream and already gone from the worker's small replay buffer:
    the repair finds a later first seq, clears and replays what is left (regression: a pending
    batch was written through a freed list tail here; ASan caught it)."""
    a = sim_with_events(sim_factory, "--kv-events-buffer-steps", "2", "--time-scale", "0.01")
    kv = router(kvroute, [a])
    wait_exact(kv, [a])
    chat_via(kv, convo("warm"), max_tokens=40)
    a.faults(drop_event_batches=5)
    for i in range(4):
        chat_via(kv, convo("traffic%d" % i), max_tokens=100)
    wait_until(lambda: kv.metrics().get("kvroute_kv_events_replays_total", worker=a.url,
                                        result="partial") >= 1, 10, what="a partial replay")
    wait_until(lambda: state(kv, a) == 0, 10, what="exact again")
    assert kv.proc.alive()
    chat_via(kv, convo("after"))


def test_garbage_frames_are_counted_and_never_crash(sim_factory, kvroute):
    a = sim_with_events(sim_factory)
    b = sim_factory("--time-scale", "0")
    pub = free_port()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:%d" % pub)
    try:
        kv = kvroute([a, b], model=SIM_MODEL, policy="precise", health_interval_ms=0,
                     extra=events_flags([a]) + [
                         "--kv-events", "%s=tcp://127.0.0.1:%d" % (b.url, pub)])
        wait_exact(kv, [a])
        garbage = [
            [b"", (0).to_bytes(8, "big"), b"\xc1\xc1\xc1"],          # not msgpack
            [b"", (1).to_bytes(8, "big"), b"\x93\x00\xdd\x10\x00\x00\x00"],  # huge declared array
            [b"", b"short", b"\x90"],                                 # seq not 8 bytes
            [b"only one frame"],
            [b"", (2).to_bytes(8, "big"), b"\x92\xcb" + b"\x00" * 8 + b"\x91\x91\xa4junk", b"x"],
        ]

        def malformed():
            return kv.metrics().get("kvroute_kv_events_malformed_total", worker=b.url)

        def spray():
            for g in garbage:
                sock.send_multipart(g)
            return malformed() >= 3
        wait_until(spray, 10, interval=0.2, what="garbage frames counted")
        assert kv.proc.alive()
        chat_via(kv, [{"role": "user", "content": "still serving?"}])
    finally:
        sock.close()
        ctx.term()


# ============================================================================ prediction error
def test_prediction_error_exported_for_both_policies(sim_factory, kvroute):
    a, b = sim_with_events(sim_factory), sim_with_events(sim_factory)
    for policy in ("cache_aware", "precise"):
        kv = router(kvroute, [a, b], policy=policy, events=policy == "precise")
        if policy == "precise":
            wait_exact(kv, [a, b])
        for i in range(3):
            chat_via(kv, convo("pred-%s" % policy))
        m = kv.metrics()
        assert m.get("kvroute_cache_prediction_error_tokens_count", model=SIM_MODEL) == 3, policy
        assert m.has("kvroute_cache_mispredictions_total"), policy


# ============================================================================ two replicas
def run_conversations(replicas, tag, n_convs=7, turns=4):
    """Conversations whose turns alternate between the replicas (an odd number of them, so
    each conversation changes replica every turn); returns (hit rate from the workers' usage,
    mean prediction error over the replicas)."""
    prompt = cached = 0
    convs = [convo("%s-c%d" % (tag, c)) for c in range(n_convs)]
    k = 0
    for t in range(turns):
        for c in range(n_convs):
            kv = replicas[k % len(replicas)]
            k += 1
            r = chat_via(kv, convs[c], max_tokens=8)
            body = r.json()
            u = body["usage"]
            prompt += u["prompt_tokens"]
            cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            answer = body["choices"][0]["message"]["content"]
            convs[c] = convs[c] + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": "turn %d %s" % (t, long_text("u", 20))}]
            time.sleep(0.02)
    err_sum = sum(kv.metrics().get("kvroute_cache_prediction_error_tokens_sum") for kv in replicas)
    err_n = sum(kv.metrics().get("kvroute_cache_prediction_error_tokens_count") for kv in replicas)
    return cached / prompt, err_sum / max(err_n, 1)


def test_two_replicas_agree_through_events(sim_factory, kvroute):
    sims = [sim_with_events(sim_factory) for _ in range(3)]
    one = router(kvroute, sims)
    wait_exact(one, sims)
    hit_one, _ = run_conversations([one], "one")
    two = [router(kvroute, sims), router(kvroute, sims)]
    for kv in two:
        wait_exact(kv, sims)
    hit_two, err_two = run_conversations(two, "two")
    ca = [router(kvroute, sims, policy="cache_aware", events=False) for _ in range(2)]
    hit_ca, _ = run_conversations(ca, "ca")
    print("fleet hit rate: precise 1 replica %.3f, 2 replicas %.3f (mean prediction error %.1f "
          "tokens); cache_aware 2 replicas %.3f" % (hit_one, hit_two, err_two, hit_ca))
    assert hit_two >= hit_one * 0.95, (hit_one, hit_two)
    assert hit_two > hit_ca, (hit_two, hit_ca)
    assert err_two <= 16, err_two


# ============================================================================ Responses API
def test_responses_chain_against_sim_workers(sim_factory, kvroute):
    """The Responses API through kvroute to real (simulated) workers: a previous_response_id
    chain stays on the worker that stored it, its cache grows turn by turn, and kvroute counts
    the Responses usage (input_tokens) and its prediction error."""
    sims = [sim_factory("--time-scale", "0") for _ in range(3)]
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=0)
    prev, worker, cached = None, None, []
    for turn in range(4):
        body = {"model": SIM_MODEL, "input": "turn %d: %s" % (turn, long_text("r%d" % turn, 60)),
                "max_output_tokens": 8,
                "instructions": long_text("sys", 200)}  # not carried over: sent every turn
        if prev:
            body["previous_response_id"] = prev
        r = kv.post("/v1/responses", body)
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["object"] == "response" and j["status"] == "completed", j
        if worker:
            assert r.headers["x-kvroute-worker"] == worker, r.headers
            assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
        worker, prev = r.headers["x-kvroute-worker"], j["id"]
        cached.append(j["usage"]["input_tokens_details"]["cached_tokens"])
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:])), cached
    # streamed continuation: same worker, SSE events end with response.completed
    with httpx.stream("POST", kv.url + "/v1/responses",
                      json={"model": SIM_MODEL, "input": "more", "previous_response_id": prev,
                            "stream": True, "max_output_tokens": 4}, timeout=10) as r:
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == worker
        events = [ln[6:].strip() for ln in r.iter_lines() if ln.startswith("event:")]
    assert events[0] == "response.created" and events[-1] == "response.completed", events
    m = kv.metrics()
    assert m.get("kvroute_cached_tokens_total", model=SIM_MODEL) >= sum(cached)
    assert m.get("kvroute_prompt_tokens_total", model=SIM_MODEL) > 0
    # only the first request was scored by the policy; continuations follow their pin
    assert m.get("kvroute_cache_prediction_error_tokens_count", model=SIM_MODEL) == 1
    # an unknown previous_response_id: the worker's own 404, relayed
    r = kv.post("/v1/responses", {"model": SIM_MODEL, "input": "x",
                                  "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and \
        r.json()["error"]["code"] == "previous_response_not_found", r.text
