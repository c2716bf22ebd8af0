"""Data-parallel workers (issue 21): a worker configured with `data_parallel_size: N` (or
`--worker URL@N`) is N routing targets URL#0 … URL#N-1 sharing its URL, connections, health
and circuit breaker, each with its own prefix-index entries, sessions, load and KV-event
state; every request to rank r carries `X-data-parallel-rank: r`. Real processes on loopback
(stub workers, a Python ZeroMQ publisher, kvroute-sim with --data-parallel-size when built
with it), bounded in time."""
import json
import os
import subprocess
import time

import httpx
import msgpack
import pytest
import zmq

from conftest import (KVROUTE_BIN, MODEL, SIM_MODEL, SSL_CTX, free_port, header_value,
                      wait_until)

RANKS = 4


def admin_port_flags():
    p = free_port()
    return p, ["--admin-port", str(p)]


def admin_get(port, path):
    r = httpx.get("http://127.0.0.1:%d%s" % (port, path), timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 200, r.text
    return r.json()


def admin(port, method, path, body=None):
    return httpx.request(method, "http://127.0.0.1:%d%s" % (port, path), timeout=10.0,
                         verify=SSL_CTX, content=None if body is None else json.dumps(body),
                         headers={"content-type": "application/json"})


def write_config(path, text):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def conversation_turns(kv, session, turns=3, headers=None):
    """Sends `turns` growing turns of one conversation; returns the responses."""
    msgs, out = [], []
    for t in range(turns):
        msgs.append({"role": "user", "content": "%s turn %d %s" % (session, t, "words " * 40)})
        h = {"x-session-id": session}
        h.update(headers or {})
        r = kv.chat(headers=h, messages=msgs)
        assert r.status_code == 200, r.text
        out.append(r)
        msgs.append({"role": "assistant", "content": "ok %d" % t})
    return out


# ============================================================================ ranks as workers
def test_every_turn_of_a_conversation_goes_to_one_rank_with_its_header(stub, kvroute):
    w = stub()
    kv = kvroute(["%s@%d" % (w.url, RANKS)], policy="cache_aware", health_interval_ms=0)
    seen = {}
    for s in range(12):
        sess = "dp-session-%d" % s
        for r in conversation_turns(kv, sess):
            seen.setdefault(sess, set()).add(r.headers["x-kvroute-worker"])
    ranks = set()
    for sess, workers in seen.items():
        assert len(workers) == 1, "%s went to several ranks: %r" % (sess, workers)
        ranks |= workers
    assert ranks <= {"%s#%d" % (w.url, r) for r in range(RANKS)}
    assert len(ranks) >= 2, "12 conversations all on one rank: %r" % ranks
    # What the engine received: one X-data-parallel-rank per request, the chosen rank's.
    log = w.requests("/v1/chat/completions")
    assert len(log) == 36
    by_session = {}
    for e in log:
        vals = [v for k, v in e["headers"] if k.lower() == "x-data-parallel-rank"]
        assert len(vals) == 1, "want exactly one X-data-parallel-rank, got %r" % vals
        sess = header_value(e, "x-session-id")
        by_session.setdefault(sess, set()).add(vals[0])
    for sess, vals in by_session.items():
        assert len(vals) == 1, "%s: ranks %r" % (sess, vals)
        (want,) = seen[sess]
        assert want.endswith("#" + next(iter(vals))), (want, vals)
    # Metrics and the load name the ranks, never the bare URL.
    m = kv.metrics()
    inflight = {lb["worker"] for lb, _ in m.find("kvroute_worker_inflight")}
    assert inflight == {"%s#%d" % (w.url, r) for r in range(RANKS)}


def test_client_cannot_choose_the_rank_and_plain_workers_get_no_header(stub, kvroute):
    dp, plain = stub(), stub()
    kv = kvroute(["%s@2" % dp.url, plain.url], policy="round_robin", health_interval_ms=0)
    for i in range(6):
        r = kv.chat(headers={"X-data-parallel-rank": "7"}, content="q%d" % i)
        assert r.status_code == 200
    for e in plain.requests("/v1/chat/completions"):
        assert header_value(e, "x-data-parallel-rank") is None
    got = [header_value(e, "x-data-parallel-rank") for e in dp.requests("/v1/chat/completions")]
    assert sorted(set(got)) == ["0", "1"], got
    # One keep-alive pool per engine: the ranks share its connections.
    assert dp.log()["connections_accepted"] <= 3


def test_url_with_userinfo_at_sign_is_not_a_rank_count(stub, kvroute, tmp_path):
    """Only a trailing @<digits> counts: --check accepts a userinfo '@' as part of the URL."""
    out = subprocess.run([str(KVROUTE_BIN), "--check", "--worker", "http://a@127.0.0.1:9@3",
                          "--worker", "http://b@127.0.0.1:10"], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 workers" in out.stdout, out.stdout
    bad = subprocess.run([str(KVROUTE_BIN), "--check", "--worker", "http://127.0.0.1:9@0"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode != 0 and "data-parallel size" in bad.stdout + bad.stderr


# ============================================================================ shared engine state
def test_health_check_is_shared_by_every_rank(stub, kvroute):
    w, other = stub(), stub()
    kv = kvroute(["%s@%d" % (w.url, RANKS), other.url], health_interval_ms=100,
                 extra=["--unhealthy-threshold", "1", "--healthy-threshold", "1"])
    time.sleep(0.5)
    checks = w.log()["health_checks"]
    assert checks <= 8, "one check per round for the engine, not per rank: %d" % checks
    w.config(health_status=503)
    ranks = ["%s#%d" % (w.url, r) for r in range(RANKS)]
    wait_until(lambda: all(kv.metrics().get("kvroute_worker_healthy", worker=u) == 0
                           for u in ranks), 5, interval=0.05, what="every rank unhealthy")
    assert kv.metrics().get("kvroute_worker_healthy", worker=other.url) == 1
    for i in range(4):
        r = kv.chat(content="x%d" % i)
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == other.url
    w.config(health_status=200)
    wait_until(lambda: all(kv.metrics().get("kvroute_worker_healthy", worker=u) == 1
                           for u in ranks), 5, interval=0.05, what="every rank healthy again")


def test_breaker_opened_by_one_rank_covers_the_engine(stub, kvroute):
    w, other = stub(), stub()
    kv = kvroute(["%s@%d" % (w.url, RANKS), other.url], policy="round_robin",
                 health_interval_ms=0,
                 extra=["--breaker-failures", "2", "--breaker-cooldown-ms", "60000",
                        "--max-retries", "0"])
    fails = 0
    for i in range(10):
        r = kv.chat(headers={"x-stub-mode": "fail:500"}, content="f%d" % i)
        if r.headers.get("x-kvroute-worker", "").startswith(w.url + "#"):
            fails += 1
        if fails >= 2:
            break
    assert fails >= 2
    ranks = ["%s#%d" % (w.url, r) for r in range(RANKS)]
    wait_until(lambda: all(kv.metrics().get("kvroute_worker_breaker_state", worker=u) == 1
                           for u in ranks), 3, interval=0.05, what="every rank's breaker open")
    for i in range(6):
        r = kv.chat(content="after%d" % i)
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == other.url


def test_a_retry_skips_the_other_ranks_of_the_engine_that_failed(stub, kvroute):
    w, other = stub(), stub()
    kv = kvroute(["%s@%d" % (w.url, RANKS), other.url], policy="round_robin",
                 health_interval_ms=0,
                 extra=["--max-retries", "2", "--breaker-failures", "0"])
    for i in range(10):
        r = kv.chat(headers={"x-stub-mode": "fail:503"}, content="retry%d" % i)
        assert r.status_code == 503
    per_request = {}
    for stub_, tag in ((w, "dp"), (other, "plain")):
        for e in stub_.requests("/v1/chat/completions"):
            per_request.setdefault(header_value(e, "x-request-id"), []).append(tag)
    assert len(per_request) == 10
    for rid, tags in per_request.items():
        # one attempt per engine: a rank of the failed engine is the same process
        assert sorted(tags) == ["dp", "plain"], (rid, tags)


# ============================================================================ fleet changes
def test_reload_removing_a_dp_worker_removes_all_its_ranks(stub, kvroute, tmp_path):
    dp, plain = stub(), stub()
    port, aflags = admin_port_flags()
    cfg = tmp_path / "kvroute.yaml"
    write_config(cfg, """\
workers:
  - {url: "%s", name: engine-a, data_parallel_size: 3}
  - {url: "%s", name: plain}
routes:
  - name: %s
    policy: round_robin
    targets: [engine-a, plain]
""" % (dp.url, plain.url, MODEL))
    kv = kvroute([], model=None, policy=None, health_interval_ms=0,
                 extra=["--config", str(cfg)] + aflags)
    rows = admin_get(port, "/workers")["workers"]
    assert sorted(r["url"] for r in rows) == sorted(
        ["%s#%d" % (dp.url, r) for r in range(3)] + [plain.url])
    assert sorted(r["name"] for r in rows) == ["engine-a#0", "engine-a#1", "engine-a#2", "plain"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["engine-a#2"]["data_parallel_rank"] == 2
    assert by_name["engine-a#2"]["engine_url"] == dp.url
    assert by_name["plain"]["data_parallel_rank"] is None
    routes = admin_get(port, "/routes")
    for i in range(6):
        assert kv.chat(content="r%d" % i).status_code == 200
    # Drain names the engine: every rank drains.
    r = admin(port, "POST", "/workers/engine-a/drain")
    assert r.status_code == 200, r.text
    assert all(w["draining"] for w in admin_get(port, "/workers")["workers"]
               if w["name"].startswith("engine-a#"))
    admin(port, "POST", "/workers/engine-a/undrain")
    write_config(cfg, """\
workers:
  - {url: "%s", name: plain}
routes:
  - name: %s
    policy: round_robin
    targets: [plain]
""" % (plain.url, MODEL))
    assert admin(port, "POST", "/reload").status_code == 200
    rows = admin_get(port, "/workers")["workers"]
    assert [r["url"] for r in rows] == [plain.url]
    wait_until(lambda: not any(lb["worker"].startswith(dp.url)
                               for lb, _ in kv.metrics().find("kvroute_worker_inflight")),
               3, interval=0.05, what="the ranks' series gone")
    assert routes  # the routes answered before the change


def test_post_workers_with_data_parallel_size_adds_and_deletes_every_rank(stub, kvroute):
    base, dp = stub(), stub()
    port, aflags = admin_port_flags()
    kv = kvroute([base.url], health_interval_ms=0, extra=aflags)
    r = admin(port, "POST", "/workers", {"url": dp.url, "name": "eng", "data_parallel_size": 2,
                                         "routes": [MODEL]})
    assert r.status_code == 201, r.text
    body = r.json()
    assert [w["url"] for w in body["workers"]] == [dp.url + "#0", dp.url + "#1"]
    assert admin(port, "POST", "/workers", {"url": dp.url}).status_code == 409
    assert admin(port, "POST", "/workers",
                 {"url": dp.url, "data_parallel_size": 0}).status_code == 400
    for i in range(6):
        assert kv.chat(content="p%d" % i).status_code == 200
    got = {header_value(e, "x-data-parallel-rank") for e in dp.requests("/v1/chat/completions")}
    assert got == {"0", "1"}
    # A name of a rank (NAME#r) cannot be taken by another worker, nor can a URL with a query.
    other = stub()
    r = admin(port, "POST", "/workers", {"url": other.url, "name": "eng#1"})
    assert r.status_code == 400 and "#N" in r.text, r.text
    assert admin(port, "POST", "/workers", {"url": other.url + "?x=1"}).status_code == 400
    r = admin(port, "DELETE", "/workers/eng")
    assert r.status_code == 200, r.text
    assert [w["url"] for w in admin_get(port, "/workers")["workers"]] == [base.url]


def test_a_worker_named_like_a_rank_is_refused_by_check_and_reload(stub, kvroute, tmp_path):
    """A worker named "a#1" beside a data-parallel worker "a" would take the name of a's rank 1:
    --check and a reload refuse it at its position, and the running config stays."""
    dp, plain = stub(), stub()
    port, aflags = admin_port_flags()
    cfg = tmp_path / "kvroute.yaml"
    good = """\
workers:
  - {url: "%s", name: a, data_parallel_size: 4}
  - {url: "%s", name: %s}
routes:
  - {name: %s, policy: round_robin, targets: [a, %s]}
"""
    write_config(cfg, good % (dp.url, plain.url, "b", MODEL, "b"))
    kv = kvroute([], model=None, policy=None, health_interval_ms=0,
                 extra=["--config", str(cfg)] + aflags)
    bad = tmp_path / "bad.yaml"
    write_config(bad, good % (dp.url, plain.url, '"a#1"', MODEL, '"a#1"'))
    out = subprocess.run([KVROUTE_BIN, "--check", "--config", str(bad)], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode != 0 and "bad.yaml:3:" in out.stdout + out.stderr, out
    write_config(cfg, good % (dp.url, plain.url, '"a#1"', MODEL, '"a#1"'))
    r = admin(port, "POST", "/reload")
    assert r.status_code != 200, r.text
    names = sorted(w["name"] for w in admin_get(port, "/workers")["workers"])
    assert names == ["a#0", "a#1", "a#2", "a#3", "b"], names
    assert kv.chat(content="still served").status_code == 200


# ============================================================================ KV events per rank
def batch(rank, tag, n=2):
    """A vLLM KV-event batch [ts, events, data_parallel_rank] storing `n` blocks."""
    evs = []
    parent = None
    for i in range(n):
        h = (hash((tag, i)) & 0x7FFFFFFFFFFF) + 1
        evs.append(["BlockStored", [h], parent, list(range(i * 16, i * 16 + 16)), 16, None, "GPU"])
        parent = h
    out = [time.time(), evs]
    if rank is not None:
        out.append(rank)
    return msgpack.packb(out)


class Publisher:
    """A PUB socket speaking vLLM's KV-event framing (topic, 8-byte seq, payload)."""

    def __init__(self, ctx, port):
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:%d" % port)
        self.seq = 0

    def send(self, payload, seq=None):
        s = self.seq if seq is None else seq
        self.sock.send_multipart([b"", s.to_bytes(8, "big"), payload])
        if seq is None:
            self.seq += 1


def events_of(kv, worker):
    return kv.metrics().get("kvroute_kv_events_total", worker=worker, type="BlockStored") or 0


def start_stream(kv, pub, workers, first):
    """Sends seq 0 until every subscriber is connected and exact (no replay endpoint: a
    stream is trusted from seq 0 on), then continues from seq 1."""
    def ok():
        pub.send(first, seq=0)
        return all(kv.metrics().get("kvroute_kv_events_state", worker=u) == 0 for u in workers)
    wait_until(ok, 10, interval=0.2, what="KV events exact on %r" % workers)
    pub.seq = 1


def test_one_endpoint_dispatched_by_data_parallel_rank(stub, kvroute, tmp_path):
    w = stub()
    ep = free_port()
    cfg = write_config(tmp_path / "kvroute.yaml", """\
workers:
  - {url: "%s", data_parallel_size: 2, kv_events: {endpoint: "tcp://127.0.0.1:%d"}}
""" % (w.url, ep))
    ctx = zmq.Context()
    pub = Publisher(ctx, ep)
    try:
        kv = kvroute([], policy="precise", health_interval_ms=0,
                     extra=["--config", str(cfg)])
        r0, r1 = w.url + "#0", w.url + "#1"
        start_stream(kv, pub, [r0, r1], batch(None, "warm", 1))
        time.sleep(0.3)  # the last seq-0 resends settle
        base0, base1 = events_of(kv, r0), events_of(kv, r1)
        assert base1 == 0 and base0 >= 1  # no rank = rank 0
        pub.send(batch(1, "one", 3))
        pub.send(batch(0, "zero", 2))
        pub.send(batch(5, "beyond", 4))  # no rank 5: dropped, counted once
        wait_until(lambda: events_of(kv, r1) == 3 and events_of(kv, r0) == base0 + 2, 5,
                   interval=0.05, what="rank 1 got 3 blocks, rank 0 got 2")
        wait_until(lambda: kv.metrics().get("kvroute_kv_events_dropped_total", worker=r0,
                                            reason="rank") == 1, 5, interval=0.05,
                   what="the batch for rank 5 counted as dropped")
        assert events_of(kv, r1) == 3 and events_of(kv, r0) == base0 + 2
    finally:
        pub.sock.close()
        ctx.term()


def test_per_rank_endpoints_with_rank_port_offset(stub, kvroute, tmp_path):
    w = stub()
    while True:  # two consecutive free ports (vLLM: port + rank)
        ep = free_port()
        try:
            ctx = zmq.Context()
            pubs = [Publisher(ctx, ep), Publisher(ctx, ep + 1)]
            break
        except zmq.ZMQError:
            ctx.destroy(linger=0)
    cfg = write_config(tmp_path / "kvroute.yaml", """\
workers:
  - url: "%s"
    data_parallel_size: 2
    kv_events: {endpoint: "tcp://127.0.0.1:%d", rank_port_offset: true}
""" % (w.url, ep))
    try:
        kv = kvroute([], policy="precise", health_interval_ms=0,
                     extra=["--config", str(cfg)])
        r0, r1 = w.url + "#0", w.url + "#1"
        start_stream(kv, pubs[0], [r0], batch(0, "w0", 1))
        start_stream(kv, pubs[1], [r1], batch(1, "w1", 1))
        time.sleep(0.3)  # the last seq-0 resends settle
        base0, base1 = events_of(kv, r0), events_of(kv, r1)
        pubs[1].send(batch(1, "one", 3))
        pubs[0].send(batch(0, "zero", 2))
        wait_until(lambda: events_of(kv, r1) == base1 + 3 and events_of(kv, r0) == base0 + 2,
                   5, interval=0.05, what="each rank's endpoint feeding its rank")
    finally:
        for p in pubs:
            p.sock.close()
        ctx.term()


# ============================================================================ tau-bench
def test_tau_bench_rank_aware_matches_four_separate_sims(tmp_path):
    """One kvroute-sim --data-parallel-size 4 behind kvroute with data_parallel_size 4: every
    conversation stays on its rank, so tau-bench's hit rate is within 5 % (relative) of the same
    replay over four separate sims; routed as a plain worker (the engine spreads requests over
    its ranks) it is measurably lower. 400 requests, three runs, ~25 s."""
    import subprocess
    from pathlib import Path
    from conftest import BUILD
    root = Path(__file__).resolve().parents[2]
    out = Path(tmp_path) / "dp.json"
    env = dict(os.environ, KVROUTE_BUILD=str(BUILD))
    p = subprocess.run(["bash", str(root / "scripts/compare.sh"), "--trace",
                        str(root / "data/tau-bench-airline-gpt4o"), "--format", "tau",
                        "--time-scale", "0.05", "--max-requests", "400", "--no-bound",
                        "--workers", "1", "--dp", "4", "--policies", "cache_aware",
                        "--json", str(out)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    runs, dp = res["policies"], res["dp"]["cache_aware"]
    print("data-parallel hit rates (tau-bench, 400 requests): %s" % json.dumps(dp))
    assert all(runs[k]["errors"] == 0 for k in runs), runs
    aware, sep, plain = (dp["rank_aware_hit_rate"], dp["separate_hit_rate"],
                         dp["plain_hit_rate"])
    assert abs(aware - sep) <= 0.05 * sep, dp
    assert plain < aware - 0.05, dp  # measurably lower without data_parallel_size
    # Every rank took a share of the conversations.
    ranks = [k for k in runs["cache_aware-dp"]["worker_requests"]]
    assert len(ranks) == 4 and all("#" in k for k in ranks), ranks


# ============================================================================ kvroute-sim ranks
def free_port_run(n):
    """A port p with p..p+n-1 all free on 127.0.0.1 now (vLLM's per-rank ports are p + r).
    Probed as the sim's listeners bind (SO_REUSEADDR, as libuv and ZeroMQ set it): a port
    whose only user is a closed connection in TIME_WAIT is free for them. Without it, a busy
    machine's TIME_WAIT sockets (the ports next to an ephemeral one are ephemeral too) failed
    every probe."""
    import socket
    for _ in range(200):
        p = free_port()
        socks = []
        try:
            for i in range(n):
                sk = socket.socket()
                socks.append(sk)
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sk.bind(("127.0.0.1", p + i))
            return p
        except OSError:
            continue
        finally:
            for sk in socks:
                sk.close()
    pytest.fail("no run of %d free ports" % n)


def dp_sim(sim_factory, mode):
    """kvroute-sim with 4 data-parallel ranks publishing KV events per rank (vLLM's ports + r:
    pub..pub+3, replay..replay+3) or all on one endpoint."""
    pub = free_port_run(2 * RANKS)
    s = sim_factory("--time-scale", "0", "--data-parallel-size", str(RANKS),
                    "--kv-events-dp", mode, "--kv-events-bind", "bind",
                    "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                    "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % (pub + RANKS))
    s.pub, s.rep = pub, pub + RANKS
    return s


@pytest.mark.parametrize("mode", ["per-rank", "shared"])
def test_sim_ranks_serve_their_conversations_and_report_their_blocks(sim_factory, kvroute,
                                                                     tmp_path, mode):
    s = dp_sim(sim_factory, mode)
    cfg = write_config(tmp_path / "kvroute.yaml", """\
workers:
  - url: "%s"
    data_parallel_size: %d
    kv_events: {endpoint: "tcp://127.0.0.1:%d", replay_endpoint: "tcp://127.0.0.1:%d",
                rank_port_offset: %s}
""" % (s.url, RANKS, s.pub, s.rep, "true" if mode == "per-rank" else "false"))
    kv = kvroute([], model=SIM_MODEL, policy="precise", health_interval_ms=0,
                 extra=["--config", str(cfg)])
    ranks = ["%s#%d" % (s.url, r) for r in range(RANKS)]
    wait_until(lambda: all(kv.metrics().get("kvroute_kv_events_state", worker=u) == 0
                           for u in ranks), 10, interval=0.05, what="every rank's events exact")
    before = {r["rank"]: r["prefix_cache_queries"] for r in s.stats()["ranks"]}
    msgs = [{"role": "system", "content": " ".join("sys%d" % i for i in range(300))},
            {"role": "user", "content": "hello"}]
    got = set()
    for t in range(3):
        r = kv.post("/v1/chat/completions", {"model": SIM_MODEL, "messages": msgs,
                                             "max_tokens": 4}, headers={"x-session-id": "s1"})
        assert r.status_code == 200, r.text
        got.add(r.headers["x-kvroute-worker"])
        msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "more %d" % t}]
    assert len(got) == 1, got
    (worker,) = got
    rank = int(worker.rsplit("#", 1)[1])
    after = {r["rank"]: r["prefix_cache_queries"] for r in s.stats()["ranks"]}
    served = {k for k in after if after[k] != before.get(k)}
    assert served == {rank}, "the sim's ranks that served: %r, kvroute chose %d" % (served, rank)

    def blocks(u):
        return kv.metrics().get("kvroute_kv_blocks", worker=u, medium="GPU") or 0
    wait_until(lambda: blocks(worker) > 0, 5, interval=0.05,
               what="the serving rank's KV events in its index")
    assert all(blocks(u) == 0 for u in ranks if u != worker), \
        {u: blocks(u) for u in ranks}


def test_one_scrape_per_engine_gives_each_rank_its_own_figures(sim_factory, kvroute):
    """vLLM labels each rank's series engine="r": every rank gets its own KV capacity (not the
    engine's sum) and its own kvroute_worker_kv_usage series."""
    s = sim_factory("--time-scale", "0", "--data-parallel-size", str(RANKS), "--kv-blocks", "100")
    port, aflags = admin_port_flags()
    kv = kvroute(["%s@%d" % (s.url, RANKS)], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--scrape-interval", "1"] + aflags)
    ranks = ["%s#%d" % (s.url, r) for r in range(RANKS)]

    def rows():
        return {x["url"]: x for x in admin_get(port, "/workers")["workers"]}
    wait_until(lambda: all(rows()[u]["kv_tokens"] == 100 * 16 for u in ranks), 5,
               interval=0.1, what="each rank's own KV capacity (100 blocks of 16)")
    m = kv.metrics()
    assert {lb["worker"] for lb, _ in m.find("kvroute_worker_kv_usage")} == set(ranks)


# ============================================================================ Kubernetes
def test_kubernetes_endpoint_of_a_dp_engine_joins_drains_and_leaves_as_all_ranks(stub, kvroute,
                                                                                 tmp_path):
    from k8s_stub import K8sStub, endpoint
    d = tmp_path / "k8s"
    d.mkdir()
    api = K8sStub(d)
    try:
        tok = d / "token"
        tok.write_text(api.token)
        w, plain = stub(), stub()
        api.set_slice("s-w", "vllm", [endpoint("pod-w")], w.port)
        port, aflags = admin_port_flags()
        kv = kvroute([plain.url], health_interval_ms=0, wait_ready=False,
                     extra=["--k8s-service", "vllm", "--k8s-namespace", "default",
                            "--k8s-api-url", api.url, "--k8s-token-file", str(tok),
                            "--k8s-ca-file", str(api.ca), "--k8s-backoff-max-ms", "300",
                            "--k8s-data-parallel-size", "3"] + aflags)
        kv.wait_ready()
        ranks = {"%s#%d" % (w.url, r) for r in range(3)}

        def urls():
            return {x["url"]: x for x in admin_get(port, "/workers")["workers"]}
        wait_until(lambda: ranks <= set(urls()), 3, interval=0.05, what="the engine's 3 ranks")
        assert {urls()[u]["name"] for u in ranks} == {"pod-w#0", "pod-w#1", "pod-w#2"}
        for i in range(8):
            assert kv.chat(content="k%d" % i).status_code == 200
        got = {header_value(e, "x-data-parallel-rank") for e in w.requests("/v1/chat/completions")}
        assert got == {"0", "1", "2"}, got
        api.set_slice("s-w", "vllm", [endpoint("pod-w", ready=False, serving=True,
                                               terminating=True)], w.port)
        wait_until(lambda: all(urls()[u]["draining"] for u in ranks), 3, interval=0.05,
                   what="every rank draining")
        api.delete_slice("s-w")
        wait_until(lambda: set(urls()) == {plain.url}, 3, interval=0.05,
                   what="every rank gone with the endpoint")
    finally:
        api.stop()
