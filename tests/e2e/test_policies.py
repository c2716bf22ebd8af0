"""The simple policies: round_robin, random, least_load, power_of_two; decision labels; in-flight
accounting seen through kvroute_worker_inflight."""
import collections
import concurrent.futures
import json
import math

import httpx
import pytest

from conftest import MODEL, RawConn, chat_body, free_port, http_post, wait_until


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
