"""The simple policies: round_robin, random, least_load, power_of_two; decision labels; in-flight
accounting seen through kvroute_worker_inflight; target weights and bounded-load hashing; the
pipeline (weighted scorers) and cost (least predicted prefill) policies."""
import collections
import concurrent.futures
import json
import math

import httpx
import pytest

from conftest import (MODEL, SIM_MODEL, RawConn, chat_body, free_port, http_post,
                      wait_until)


def route(kv, n, **body_kw):
    """Sends n sequential chat requests; returns the x-kvroute-worker of each."""
    out = []
    for _ in range(n):
        r = kv.chat(**body_kw)
        assert r.status_code == 200, r.text[:200]
        out.append(r.headers.get("x-kvroute-worker"))
    return out


class Held:
    """A request kept in flight at a worker (the worker delays its answer)."""

    def __init__(self, kv, delay_ms=4000):
        self.c = RawConn(kv.port, timeout=delay_ms / 1000.0 + 5)
        self.c.send(http_post(kv.port, "/v1/chat/completions", json.dumps(chat_body()).encode(),
                              ["x-stub-mode: json,delay:%d" % delay_ms]))

    def finish(self):
        r = self.c.read_response(timeout=10)
        self.c.close()
        return r

    def abort(self):
        self.c.close()


def held_worker(stubs):
    """Waits until one stub has the held request; returns that stub."""
    def find():
        for s in stubs:
            if any("delay" in (e["mode"] or "") for e in s.proxied()):
                return s
        return None
    return wait_until(find, 3.0, what="the held request to reach a worker")


def test_round_robin_alternates(stub, kvroute):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="round_robin", health_interval_ms=0)
    seq = route(kv, 8)
    assert all(a != b for a, b in zip(seq, seq[1:])), "round_robin did not alternate: %r" % seq
    assert collections.Counter(seq) == {ws[0].url: 4, ws[1].url: 4}
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="round_robin", decision="round_robin",
                 model=MODEL) == 8
    for w in ws:
        assert len(w.proxied()) == 4


def test_round_robin_three_workers_cycle(stub, kvroute):
    ws = [stub(), stub(), stub()]
    kv = kvroute(ws, policy="round_robin", health_interval_ms=0)
    seq = route(kv, 9)
    for i in range(3, 9):
        assert seq[i] == seq[i - 3], "not a cycle: %r" % seq
    assert set(seq) == {w.url for w in ws}


def test_random_covers_all_workers(stub, kvroute):
    ws = [stub(), stub(), stub()]
    kv = kvroute(ws, policy="random", health_interval_ms=0)
    seq = route(kv, 60)
    c = collections.Counter(seq)
    assert set(c) == {w.url for w in ws}, "random never picked some worker: %r" % c
    # each worker's share is far from 0 and from 1 (p of failing by chance < 1e-6)
    assert all(5 <= v <= 40 for v in c.values()), c
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="random", decision="random") == 60
    r = kv.chat()
    assert r.headers.get("x-kvroute-decision") == "random"


def test_least_load_prefers_idle_worker(stub, kvroute):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="least_load", health_interval_ms=0)
    h = Held(kv, delay_ms=1500)
    try:
        busy = held_worker(ws)
        idle = ws[1] if busy is ws[0] else ws[0]
        infl = kv.inflight()
        assert infl.get(busy.url) == 1 and infl.get(idle.url) == 0, \
            "kvroute_worker_inflight during a held request: %r" % infl
        seq = route(kv, 6)
        assert seq == [idle.url] * 6, "least_load sent work to the busy worker: %r (busy %s)" % (
            seq, busy.url)
        r = kv.chat()
        assert r.headers.get("x-kvroute-decision") == "least_load"
    finally:
        resp = h.finish()
    assert resp is not None and resp.status == 200, resp
    kv.wait_inflight_zero()


def test_least_load_ties_are_random(stub, kvroute):
    """With equal load, picks must not follow list order (DESIGN §7)."""
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="least_load", health_interval_ms=0)
    seq = route(kv, 30)
    c = collections.Counter(seq)
    assert set(c) == {w.url for w in ws}, "tie-break always chose the same worker: %r" % c


def test_power_of_two_avoids_busy_worker(stub, kvroute):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="power_of_two", health_interval_ms=0)
    h = Held(kv, delay_ms=1500)
    try:
        busy = held_worker(ws)
        idle = ws[1] if busy is ws[0] else ws[0]
        seq = route(kv, 8)
        assert seq == [idle.url] * 8, \
            "power_of_two (2 workers: both sampled) sent work to the busy one: %r" % seq
        r = kv.chat()
        assert r.headers.get("x-kvroute-decision") == "power_of_two"
    finally:
        resp = h.finish()
    assert resp is not None and resp.status == 200
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="power_of_two", decision="power_of_two") == 10


def test_power_of_two_spreads_when_idle(stub, kvroute):
    ws = [stub(), stub(), stub()]
    kv = kvroute(ws, policy="power_of_two", health_interval_ms=0)
    seq = route(kv, 45)
    c = collections.Counter(seq)
    assert set(c) == {w.url for w in ws}, "power_of_two never used some worker: %r" % c


def test_least_load_counts_concurrent_streams(stub, kvroute):
    """Two held requests on one worker, one on the other: the next goes to the lighter one."""
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="least_load", health_interval_ms=0)
    held = []
    try:
        for _ in range(3):
            held.append(Held(kv, delay_ms=1500))
            n = len(held)
            wait_until(lambda: sum(len(w.proxied()) for w in ws) == n, 3.0,
                       what="%d held requests at the workers" % n)
        counts = {w.url: len(w.proxied()) for w in ws}
        assert sorted(counts.values()) == [1, 2], "least_load spread 3 requests as %r" % counts
        infl = kv.inflight()
        assert infl == counts, "kvroute_worker_inflight %r != requests at workers %r" % (infl, counts)
        light = min(counts, key=counts.get)
        seq = route(kv, 3)
        assert seq == [light] * 3, "expected the lighter worker %s: %r" % (light, seq)
    finally:
        for h in held:
            h.finish()
    kv.wait_inflight_zero()


def test_inflight_released_when_client_aborts_held_request(stub, kvroute):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="least_load", health_interval_ms=0)
    h = Held(kv, delay_ms=1500)
    busy = held_worker(ws)
    assert kv.inflight()[busy.url] == 1
    h.abort()
    kv.wait_inflight_zero(timeout=1.0)
    # and the worker is preferred again on ties: both get work
    seq = route(kv, 20)
    assert set(seq) == {w.url for w in ws}, seq


# ============================================================================ target weights
def weighted_config(tmp_path, ws, weights, policy, extra=""):
    """A config file: one route `MODEL` over the stubs with these target weights."""
    text = ("health_interval_ms: 0\nworkers:\n" +
            "".join('  - {url: "%s", name: w%d}\n' % (w.url, i) for i, w in enumerate(ws)) +
            "routes:\n  - name: %s\n    policy: %s\n%s    targets:\n" % (MODEL, policy, extra) +
            "".join("      - {worker: w%d, weight: %s}\n" % (i, wt) for i, wt in enumerate(weights)))
    p = tmp_path / "weights.yaml"
    p.write_text(text)
    return p


def test_round_robin_follows_target_weights(stub, kvroute, tmp_path):
    """Smooth weighted round robin: weights 3 and 1 → a a b a, 30:10 over 40."""
    ws = [stub(), stub()]
    admin = free_port()
    kv = kvroute([], model=None, policy=None,
                 extra=["--config", weighted_config(tmp_path, ws, [3, 1], "round_robin"),
                        "--admin-port", admin])
    seq = route(kv, 40)
    c = collections.Counter(seq)
    assert c == {ws[0].url: 30, ws[1].url: 10}, c
    heavy, light = ws[0].url, ws[1].url
    assert seq[:8] == [heavy, heavy, light, heavy] * 2, "not smooth: %r" % seq[:8]
    # /debug/route shows each target's weight and does not take a turn
    r = httpx.post("http://127.0.0.1:%d/debug/route" % admin, json=chat_body(), timeout=5.0)
    assert r.status_code == 200, r.text
    assert {w["url"]: w["weight"] for w in r.json()["workers"]} == {heavy: 3, light: 1}
    assert route(kv, 4) == [heavy, heavy, light, heavy]


def slow_sessions(kv, n, sessions, delay_ms):
    """Starts `n` concurrent slow chat requests spread over `sessions` (x-session-id)."""
    ex = concurrent.futures.ThreadPoolExecutor(n)

    def one(i):
        return kv.chat(headers={"x-stub-mode": "json,delay:%d" % delay_ms,
                                "x-session-id": sessions[i % len(sessions)]},
                       timeout=delay_ms / 1000.0 + 15, content="turn %d" % i)
    return ex, [ex.submit(one, i) for i in range(n)]


def in_progress(ws):
    return {w.url: sum(1 for e in w.proxied() if e["ended"] == "in_progress") for w in ws}


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_hash_policies_bound_loads(stub, kvroute, policy):
    """40 concurrent slow requests over 3 session keys and 4 workers: the owners of the hot
    keys spill (--hash-load-factor 1.25 by default) and no worker holds more than
    ceil(1.25 × mean) + 1."""
    ws = [stub() for _ in range(4)]
    kv = kvroute(ws, policy=policy, health_interval_ms=0)
    n, mean = 40, 40 / 4
    ex, futs = slow_sessions(kv, n, ["bounded-a", "bounded-b", "bounded-c"], 3000)
    try:
        wait_until(lambda: sum(in_progress(ws).values()) == n, 10.0,
                   what="%d requests in progress at the workers" % n)
        held, infl = in_progress(ws), kv.inflight()
        assert infl == held, "kvroute_worker_inflight %r != in progress %r" % (infl, held)
        assert max(held.values()) <= math.ceil(1.25 * mean) + 1, held
        assert kv.metrics().get("kvroute_hash_overflows_total", model=MODEL) > 0
    finally:
        rs = [f.result() for f in futs]
        ex.shutdown()
    assert all(r.status_code == 200 for r in rs), [r.status_code for r in rs]
    assert all(r.headers.get("x-kvroute-decision") == policy for r in rs)


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_hash_load_factor_zero_is_unbounded(stub, kvroute, tmp_path, policy):
    """Per route `hash_load_factor: 0` (config file): one session's concurrent requests all
    stay on its owner."""
    ws = [stub() for _ in range(3)]
    cfg = weighted_config(tmp_path, ws, [1, 1, 1], policy, extra="    hash_load_factor: 0\n")
    kv = kvroute([], model=None, policy=None, extra=["--config", cfg])
    ex, futs = slow_sessions(kv, 12, ["only-one"], 1500)
    try:
        wait_until(lambda: sum(in_progress(ws).values()) == 12, 10.0,
                   what="12 requests in progress at the workers")
        assert sorted(in_progress(ws).values()) == [0, 0, 12], in_progress(ws)
    finally:
        rs = [f.result() for f in futs]
        ex.shutdown()
    assert all(r.status_code == 200 for r in rs)
    assert kv.metrics().get("kvroute_hash_overflows_total", model=MODEL) == 0


# ============================================================================ pipeline
def debug_route(admin, body):
    r = httpx.post("http://127.0.0.1:%d/debug/route" % admin, json=body, timeout=5.0)
    assert r.status_code == 200, r.text
    return r.json()


def test_pipeline_load_scorer_settles_in_flight_by_weight(stub, kvroute, tmp_path):
    """Target weights 3 and 1, `scorers: {load: 1}`: 40 concurrent slow requests settle 30:10
    in flight (±3), as 1 − (in-flight / weight) ÷ the largest such value makes them."""
    ws = [stub(), stub()]
    cfg = weighted_config(tmp_path, ws, [3, 1], "pipeline", extra="    scorers: {load: 1}\n")
    kv = kvroute([], model=None, policy=None, extra=["--config", cfg])
    n = 40
    ex, futs = slow_sessions(kv, n, ["p%d" % i for i in range(n)], 3000)
    try:
        wait_until(lambda: sum(in_progress(ws).values()) == n, 10.0,
                   what="%d requests in progress at the workers" % n)
        held = in_progress(ws)
        assert kv.inflight() == held
        assert abs(held[ws[0].url] - 30) <= 3 and abs(held[ws[1].url] - 10) <= 3, held
    finally:
        rs = [f.result() for f in futs]
        ex.shutdown()
    assert all(r.status_code == 200 for r in rs), [r.status_code for r in rs]
    assert all(r.headers.get("x-kvroute-decision") == "pipeline" for r in rs)
    assert kv.metrics().get("kvroute_decisions_total", policy="pipeline", decision="pipeline",
                            model=MODEL) == n


def test_pipeline_weight_scorer_sends_everything_to_the_heaviest(stub, kvroute, tmp_path):
    ws = [stub(), stub()]
    cfg = weighted_config(tmp_path, ws, [3, 1], "pipeline", extra="    scorers: {weight: 1}\n")
    kv = kvroute([], model=None, policy=None, extra=["--config", cfg])
    assert route(kv, 20) == [ws[0].url] * 20
    assert len(ws[1].proxied()) == 0


def test_pipeline_debug_route_lists_per_scorer_values(stub, kvroute, tmp_path):
    """Default scorers (prefix 3, session 4, load 2, kv_usage 1, weight 1): /debug/route shows
    every scorer's value and their weighted sum per worker; the session's worker wins."""
    ws = [stub(), stub()]
    admin = free_port()
    cfg = weighted_config(tmp_path, ws, [2, 1], "pipeline")
    kv = kvroute([], model=None, policy=None, extra=["--config", cfg, "--admin-port", admin])
    h = {"x-session-id": "pipe-1"}
    first = kv.chat(headers=h, content="a conversation that will continue")
    assert first.status_code == 200 and first.headers["x-kvroute-decision"] == "pipeline"
    owner = first.headers["x-kvroute-worker"]
    d = debug_route(admin, chat_body(content="a conversation that will continue"))
    assert d["policy"] == "pipeline" and d["decision"] == "pipeline"
    want = {"prefix": 3, "session": 4, "load": 2, "queue": 0, "kv_usage": 1, "weight": 1,
            "lmcache": 0}
    for row in d["workers"]:
        sc = row["scorers"]
        assert set(sc) == set(want), sc
        assert all(0 <= v <= 1 for v in sc.values()), sc
        assert row["score"] == pytest.approx(sum(want[k] * sc[k] for k in want)), row
        assert sc["weight"] == pytest.approx(row["weight"] / 2)
        assert sc["load"] == 1 and sc["session"] == 0  # idle; no session key in this body
    rows = {row["url"]: row for row in d["workers"]}
    assert rows[owner]["scorers"]["prefix"] == pytest.approx(1)
    # With the session key, the session scorer is 1 on its worker and decides.
    r = httpx.post("http://127.0.0.1:%d/debug/route" % admin, headers=h, timeout=5.0,
                   json=chat_body(content="something else entirely"))
    rows = {row["url"]: row for row in r.json()["workers"]}
    assert rows[owner]["scorers"]["session"] == 1 and rows[owner]["session_owner"]
    assert r.json()["worker"] == owner
    assert kv.chat(headers=h, content="turn 2").headers["x-kvroute-worker"] == owner


def test_scorer_flags_replace_the_defaults(stub, kvroute):
    """--scorer NAME=WEIGHT (repeatable) replaces the default weights entirely."""
    ws = [stub(), stub()]
    admin = free_port()
    kv = kvroute(ws, policy="pipeline", health_interval_ms=0,
                 extra=["--scorer", "load=1", "--scorer", "queue=0.5", "--admin-port", admin])
    d = debug_route(admin, chat_body())
    for row in d["workers"]:
        assert row["score"] == pytest.approx(row["scorers"]["load"] +
                                             0.5 * row["scorers"]["queue"]), row


# ============================================================================ cost
def long_prompt(tag, words=1500):
    return " ".join("%s-%d" % (tag, i) for i in range(words))


def test_cost_sends_a_repeated_long_prompt_to_the_worker_that_holds_it(stub, kvroute):
    ws = [stub(), stub(), stub()]
    admin = free_port()
    kv = kvroute(ws, policy="cost", health_interval_ms=0, extra=["--admin-port", admin])
    p = long_prompt("repeat")
    first = kv.chat(content=p)
    assert first.status_code == 200 and first.headers["x-kvroute-decision"] == "min_cost"
    holder = first.headers["x-kvroute-worker"]
    for _ in range(8):
        r = kv.chat(content=p)
        assert r.headers["x-kvroute-worker"] == holder
        assert r.headers["x-kvroute-decision"] == "min_cost"
        assert r.headers["x-kvroute-match"] == "1.00"
    d = debug_route(admin, chat_body(content=p))
    rows = {row["url"]: row for row in d["workers"]}
    assert rows[holder]["uncached_tokens"] == 1
    assert all(row["uncached_tokens"] > 1000 for u, row in rows.items() if u != holder)
    assert all(row["prefill_pending_tokens"] == 0 for row in rows.values())
    assert d["worker"] == holder and rows[holder]["cost_s"] < min(
        row["cost_s"] for u, row in rows.items() if u != holder)


def test_cost_spreads_distinct_prompts_across_idle_workers(stub, kvroute):
    """12 concurrent slow requests with distinct long prompts over 3 idle workers: each one's
    prefill stays pending until its first byte, so the next goes elsewhere: 4 each."""
    ws = [stub(), stub(), stub()]
    kv = kvroute(ws, policy="cost", health_interval_ms=0)
    n = 12
    ex = concurrent.futures.ThreadPoolExecutor(n)
    futs = [ex.submit(kv.chat, headers={"x-stub-mode": "json,delay:2000"}, timeout=20,
                      content=long_prompt("distinct%02d" % i, 800)) for i in range(n)]
    try:
        wait_until(lambda: sum(in_progress(ws).values()) == n, 10.0,
                   what="%d requests in progress at the workers" % n)
        assert sorted(in_progress(ws).values()) == [4, 4, 4], in_progress(ws)
    finally:
        rs = [f.result() for f in futs]
        ex.shutdown()
    assert all(r.status_code == 200 and r.headers["x-kvroute-decision"] == "min_cost"
               for r in rs)


def test_cost_learns_prefill_speed_from_streamed_first_bytes(sim_factory, kvroute):
    """Seconds per prefill token are equal until measured; streamed answers' first bytes
    measure their worker (the time above its fastest first byte, over the tokens), and an
    unmeasured worker then counts at the measured mean."""
    sims = [sim_factory("--time-scale", "0.05") for _ in range(2)]
    admin = free_port()
    kv = kvroute(sims, model=SIM_MODEL, policy="cost", health_interval_ms=0,
                 extra=["--admin-port", admin])
    msgs = [{"role": "user", "content": long_prompt("speed", 600)}]
    d = debug_route(admin, {"model": SIM_MODEL, "messages": msgs})
    assert {row["seconds_per_token"] for row in d["workers"]} == {25e-6}
    # A whole JSON body arrives after decoding: it says nothing about prefill.
    r = kv.post("/v1/chat/completions", {"model": SIM_MODEL, "messages": msgs, "max_tokens": 4})
    assert r.status_code == 200
    d = debug_route(admin, {"model": SIM_MODEL, "messages": msgs})
    assert {row["seconds_per_token"] for row in d["workers"]} == {25e-6}
    used = set()
    for i, words in enumerate([5, 2000, 4000]):
        body = {"model": SIM_MODEL, "max_tokens": 4, "stream": True, "messages": [
            {"role": "user", "content": long_prompt("stream%d" % i, words)}]}
        with httpx.stream("POST", kv.url + "/v1/chat/completions", json=body, timeout=20.0,
                          headers={"x-session-id": "speed-test"}) as s:
            assert s.status_code == 200
            assert s.headers["x-kvroute-decision"] in ("min_cost", "session_id_match")
            used.add(s.headers["x-kvroute-worker"])
            b"".join(s.iter_bytes())
    assert len(used) == 1, used  # the session stayed (its worker within 2x of the least)
    used = used.pop()
    d = debug_route(admin, {"model": SIM_MODEL, "messages": msgs})
    spt = {row["url"]: row["seconds_per_token"] for row in d["workers"]}
    assert spt[used] != 25e-6 and spt[used] > 0, spt
    assert len(set(spt.values())) == 1, spt  # the other one counts at the measured mean
