"""lmcache_aware: kvroute polls each worker's `lmcache: {endpoint}` every
--lmcache-interval-ms for {"occupancy", "cache_available"} and prefers the worker with the most
free capacity, then the lower load, then chance; a failed, malformed or stale answer makes that
worker neutral (never excluded). kvroute-sim serves GET /lmcache/status. Polls are under the
egress policy (load time and connect time).

Real processes on 127.0.0.1 only: stub workers (tests/e2e/stub_worker.py) whose
/lmcache/status answers what a test sets through /stub/config (`lmcache`, `lmcache_status`,
`lmcache_delay_ms`), and kvroute-sim workers. Intervals are short (100-300 ms) so each test
takes a few seconds; every wait is bounded.
"""
import signal
import subprocess

import httpx
import pytest

from conftest import (KVROUTE_BIN, MODEL, SIM_MODEL, SSL_CTX, Proc, free_port, wait_until)

STATUS = "/lmcache/status"


# ============================================================================ helpers
class Admin:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def workers(self):
        r = httpx.get(self.base + "/workers", timeout=5.0, verify=SSL_CTX)
        assert r.status_code == 200, r.text
        return {w["url"]: w for w in r.json()["workers"]}

    def reload(self):
        return httpx.post(self.base + "/reload", content=b"{}", timeout=5.0, verify=SSL_CTX,
                          headers={"content-type": "application/json"})


def write_config(path, text):
    """Writes atomically (a reload never reads half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def config_text(workers, interval_ms=100, model=MODEL, extra=""):
    """One route `model` over `workers` [(url, endpoint or None)], policy lmcache_aware, no
    health checks or scrapes (nothing but the polls talks to the workers unasked)."""
    lines = ["model: %s" % model, "policy: lmcache_aware", "health_interval_ms: 0",
             "scrape_interval: 0", "lmcache_interval_ms: %d" % interval_ms, extra, "workers:"]
    for url, ep in workers:
        if ep:
            lines.append('  - {url: "%s", lmcache: {endpoint: "%s"}}' % (url, ep))
        else:
            lines.append('  - "%s"' % url)
    return "\n".join(lines) + "\n"


def start(kvroute, tmp_path, text, admin=True):
    cfg = write_config(tmp_path / "kvroute.yaml", text)
    args = ["--config", str(cfg)]
    adm = None
    if admin:
        p = free_port()
        args += ["--admin-port", p]
        adm = Admin(p)
    kv = kvroute([], model=None, policy=None, extra=args)
    return kv, adm, cfg


def answer(occupancy, available=True):
    return {"occupancy": occupancy, "cache_available": available}


def polls(kv, worker, result):
    return kv.metrics().get("kvroute_lmcache_polls_total", worker=worker, result=result)


def wait_polls(kv, worker, result, n=1, timeout=5.0):
    wait_until(lambda: polls(kv, worker, result) >= n, timeout, interval=0.05,
               what="%d %s lmcache poll(s) of %s" % (n, result, worker))


def wait_state(adm, worker, state, occupancy=None, timeout=5.0):
    def ok():
        lm = adm.workers()[worker]["lmcache"]
        return lm and lm["state"] == state and (occupancy is None or lm["occupancy"] == occupancy)
    wait_until(ok, timeout, interval=0.05,
               what="/workers to show %s lmcache %s %s" % (worker, state, occupancy))


def served(kv, n, tag, model=MODEL):
    """Sends n sequential chats; returns the x-kvroute-worker of each (all must be 200)."""
    out = []
    for i in range(n):
        r = kv.post("/v1/chat/completions", {"model": model, "max_tokens": 2, "messages": [
            {"role": "user", "content": "%s %d" % (tag, i)}]}, timeout=10.0)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        out.append(r.headers.get("x-kvroute-worker"))
    return out


def run_quick(procs, tmp_path, argv, timeout=10.0):
    """Runs a command that exits by itself (--check); returns (status, stdout, stderr)."""
    if not KVROUTE_BIN.exists():
        pytest.skip("kvroute binary not built: %s" % KVROUTE_BIN)
    p = Proc([str(a) for a in argv], tmp_path / ("quick-%d.stderr" % len(procs.procs)),
             stdout=subprocess.PIPE)
    procs.procs.append(p)
    try:
        out, _ = p.popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("%s did not exit within %.0fs" % (" ".join(map(str, argv)), timeout))
    return p.popen.returncode, out.decode("utf-8", "replace"), p.stderr_text()


# ============================================================================ ranking
def test_lmcache_aware_prefers_more_free_capacity(stub, kvroute, tmp_path):
    """lmcache_aware: occupancy 0.2 preferred over 0.9, whatever the order; it follows the
    answers as they change."""
    a, b = stub(name="a"), stub(name="b")
    a.config(lmcache=answer(0.2))
    b.config(lmcache=answer(0.9))
    kv, adm, _ = start(kvroute, tmp_path, config_text([(b.url, b.url + STATUS),
                                                       (a.url, a.url + STATUS)]))
    wait_polls(kv, a.url, "ok")
    wait_polls(kv, b.url, "ok")
    m = kv.metrics()
    assert m.get("kvroute_lmcache_occupancy", worker=a.url) == 0.2
    assert m.get("kvroute_lmcache_occupancy", worker=b.url) == 0.9
    got = served(kv, 20, "prefer")
    assert got == [a.url] * 20, got
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="lmcache_aware", decision="lmcache_aware") == 20
    lm = adm.workers()[a.url]["lmcache"]
    assert lm["endpoint"] == a.url + STATUS and lm["state"] == "available", lm
    assert lm["occupancy"] == 0.2 and lm["cache_available"] is True and lm["age_ms"] >= 0, lm
    assert b.log()["lmcache_polls"] >= 1 and not b.proxied()

    # a fills up: b has more room now
    a.config(lmcache=answer(0.95))
    wait_state(adm, a.url, "available", 0.95)
    assert served(kv, 10, "flip") == [b.url] * 10
    # an unavailable cache ranks below everything, however empty
    b.config(lmcache=answer(0.0, available=False))
    wait_state(adm, b.url, "unavailable")
    assert served(kv, 10, "unavailable") == [a.url] * 10


def test_lmcache_endpoint_follows_reload(stub, kvroute, tmp_path):
    a, b = stub(name="a"), stub(name="b")
    a.config(lmcache=answer(0.2))
    b.config(lmcache=answer(0.9))
    kv, adm, cfg = start(kvroute, tmp_path, config_text([(a.url, a.url + STATUS),
                                                         (b.url, b.url + STATUS)]))
    wait_polls(kv, a.url, "ok")
    wait_polls(kv, b.url, "ok")
    assert served(kv, 5, "before") == [a.url] * 5
    # swap the endpoints: each worker now reads the other's answer
    write_config(cfg, config_text([(a.url, b.url + STATUS), (b.url, a.url + STATUS)]))
    r = adm.reload()
    assert r.status_code == 200, r.text
    wait_state(adm, b.url, "available", 0.2)
    wait_state(adm, a.url, "available", 0.9)
    assert adm.workers()[b.url]["lmcache"]["endpoint"] == a.url + STATUS
    assert served(kv, 5, "after") == [b.url] * 5
    # dropped from the file: no endpoint, no polls, no occupancy series
    write_config(cfg, config_text([(a.url, b.url + STATUS), (b.url, None)]))
    assert adm.reload().status_code == 200
    wait_until(lambda: adm.workers()[b.url]["lmcache"] is None, 5, what="b's lmcache gone")
    assert not kv.metrics().find("kvroute_lmcache_occupancy", worker=b.url)


# ============================================================================ neutral workers
def test_dead_lmcache_endpoint_leaves_the_worker_neutral(stub, kvroute, tmp_path):
    """A dead lmcache endpoint → that worker neutral and traffic continues: it ranks at the
    median free capacity of the others (here b's), so the two share the traffic; it is never
    excluded, and it ranks above a worker whose cache is unavailable."""
    a, b = stub(name="a"), stub(name="b")
    b.config(lmcache=answer(0.9))
    dead = "http://127.0.0.1:%d%s" % (free_port(), STATUS)  # nothing listens there
    kv, adm, _ = start(kvroute, tmp_path, config_text([(a.url, dead), (b.url, b.url + STATUS)]))
    wait_polls(kv, a.url, "error", 2)
    wait_polls(kv, b.url, "ok")
    lm = adm.workers()[a.url]["lmcache"]
    assert lm["state"] == "neutral" and lm["occupancy"] is None, lm
    assert not kv.metrics().find("kvroute_lmcache_occupancy", worker=a.url)
    got = served(kv, 40, "dead")
    assert got.count(a.url) >= 5 and got.count(b.url) >= 5, got
    assert polls(kv, a.url, "ok") == 0
    b.config(lmcache=answer(0.0, available=False))
    wait_state(adm, b.url, "unavailable")
    assert served(kv, 10, "dead-only") == [a.url] * 10
    assert kv.metrics().get("kvroute_requests_total", code=lambda c: c.startswith("5")) == 0


def test_malformed_and_failed_answers_are_neutral(stub, kvroute, tmp_path):
    a, b = stub(name="a"), stub(name="b")
    a.config(lmcache=answer(0.0))  # all free: a takes everything while this counts
    b.config(lmcache=answer(0.5))
    kv, adm, _ = start(kvroute, tmp_path, config_text([(a.url, a.url + STATUS),
                                                       (b.url, b.url + STATUS)]))
    wait_state(adm, a.url, "available", 0.0)
    wait_polls(kv, b.url, "ok")
    assert served(kv, 5, "ok") == [a.url] * 5
    bad = ["not json", answer(1.5), {"occupancy": 0.1}, {"occupancy": "0.1",
                                                        "cache_available": True},
           answer(0.1, available="yes")]
    for body in bad:
        before = polls(kv, a.url, "malformed")
        a.config(lmcache=body)
        wait_polls(kv, a.url, "malformed", before + 1)
        wait_state(adm, a.url, "neutral")
        # neutral at b's 0.5: a tie that chance breaks, never all to a
        got = served(kv, 30, "malformed")
        assert got.count(a.url) >= 3 and got.count(b.url) >= 3, (body, got)
    # an error status is a failed poll
    a.config(lmcache=answer(0.0), lmcache_status=503)
    wait_polls(kv, a.url, "error")
    wait_state(adm, a.url, "neutral")
    a.config(lmcache_status=200)
    wait_state(adm, a.url, "available", 0.0)
    assert served(kv, 5, "recovered") == [a.url] * 5


def test_stale_lmcache_answer_is_neutral(stub, kvroute, tmp_path):
    """An answer that arrives more than three intervals after its poll was sent is stale: the
    worker is neutral though the answer is well-formed (counted result=stale, not ok)."""
    interval = 300
    a, b = stub(name="a"), stub(name="b")
    # a: all free, but each answer takes four intervals (the poll's deadline is five)
    a.config(lmcache=answer(0.0), lmcache_delay_ms=4 * interval)
    b.config(lmcache=answer(0.5))
    kv, adm, _ = start(kvroute, tmp_path, config_text([(a.url, a.url + STATUS),
                                                       (b.url, b.url + STATUS)],
                                                      interval_ms=interval))
    wait_polls(kv, a.url, "stale", timeout=8.0)
    wait_polls(kv, b.url, "ok")
    lm = adm.workers()[a.url]["lmcache"]
    assert lm["state"] == "neutral" and lm["occupancy"] == 0.0, lm  # known, but too old
    assert lm["age_ms"] >= 3 * interval, lm
    got = served(kv, 40, "stale")
    assert got.count(a.url) >= 5 and got.count(b.url) >= 5, got
    assert polls(kv, a.url, "ok") == 0 and polls(kv, a.url, "error") == 0
    # fast again: fresh answers, and a's free capacity counts
    a.config(lmcache_delay_ms=0)
    wait_polls(kv, a.url, "ok", timeout=8.0)
    wait_state(adm, a.url, "available", 0.0)
    assert served(kv, 10, "fresh") == [a.url] * 10


def test_worker_key_goes_only_to_its_own_lmcache_origin(stub, kvroute, tmp_path, monkeypatch):
    """The worker's own key is sent to an lmcache endpoint on the worker's own origin, never to
    another host's."""
    a, b, other = stub(name="a"), stub(name="b"), stub(name="other")
    for s in (a, other):
        s.config(lmcache=answer(0.5))
    monkeypatch.setenv("KVR_E2E_LMC_KEY_A", "up-key-a-Zq81")
    monkeypatch.setenv("KVR_E2E_LMC_KEY_B", "up-key-b-Wx27")
    text = config_text([]) + (
        '  - {url: "%s", api_key_env: KVR_E2E_LMC_KEY_A, lmcache: {endpoint: "%s"}}\n'
        '  - {url: "%s", api_key_env: KVR_E2E_LMC_KEY_B, lmcache: {endpoint: "%s"}}\n'
        % (a.url, a.url + STATUS, b.url, other.url + STATUS))
    kv, _, _ = start(kvroute, tmp_path, text, admin=False)
    wait_polls(kv, a.url, "ok")
    wait_polls(kv, b.url, "ok")

    def auth(s):
        return [v for k, v in s.log()["lmcache_headers"] if k.lower() == "authorization"]
    assert auth(a) == ["Bearer up-key-a-Zq81"]
    assert auth(other) == []
    assert "up-key" not in kv.proc.stderr_text()


def test_shutdown_with_a_poll_in_flight(stub, kvroute, tmp_path):
    """SIGTERM while a poll waits for its answer: kvroute still exits 0 (under ASan: nothing
    leaked)."""
    a = stub(name="a")
    a.config(lmcache=answer(0.1), lmcache_delay_ms=20000)
    kv, _, _ = start(kvroute, tmp_path, config_text([(a.url, a.url + STATUS)],
                                                    interval_ms=1000), admin=False)
    wait_until(lambda: a.log()["lmcache_polls"] >= 1, 5, what="a poll to reach the stub")
    assert served(kv, 3, "x") == [a.url] * 3
    kv.proc.signal(signal.SIGTERM)
    assert kv.proc.wait(10) == 0, kv.proc.stderr_text(20)


# ============================================================================ kvroute-sim
def test_sim_lmcache_status(sim_factory, kvroute, tmp_path):
    """kvroute-sim's GET /lmcache/status: {"occupancy": cached blocks / KV blocks,
    "cache_available": true}; kvroute then steers new work away from a sim whose cache is
    fuller."""
    s1 = sim_factory("--time-scale", "0", "--kv-blocks", "64")
    s2 = sim_factory("--time-scale", "0", "--kv-blocks", "64")
    r = s1.client.get(STATUS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == {"occupancy": 0.0, "cache_available": True}, r.text
    assert s1.client.post(STATUS, content=b"{}").status_code == 405
    s1.chat([{"role": "user", "content": "fill the cache " * 120}], max_tokens=4)
    st = s1.stats()
    body = s1.client.get(STATUS).json()
    assert set(body) == {"occupancy", "cache_available"}, body
    assert st["kv_blocks_cached"] > 0
    assert body["occupancy"] == pytest.approx(st["kv_blocks_cached"] / st["kv_blocks"]), (body, st)
    assert 0 < body["occupancy"] <= 1 and body["cache_available"] is True

    kv, adm, _ = start(kvroute, tmp_path, config_text([(s1.url, s1.url + STATUS),
                                                       (s2.url, s2.url + STATUS)],
                                                      model=SIM_MODEL))
    wait_state(adm, s1.url, "available", body["occupancy"])
    wait_state(adm, s2.url, "available", 0.0)
    assert served(kv, 5, "sim", model=SIM_MODEL) == [s2.url] * 5


# ============================================================================ egress
def test_lmcache_endpoint_under_egress_policy(procs, stub, kvroute, tmp_path):
    """Load time: a denied or malformed lmcache endpoint fails the configuration, naming the
    worker and the rule. Connect time: an endpoint named by host name that resolves into a
    denied range is refused, counted in kvroute_egress_denied_total, and never reached."""
    w = stub()
    base = config_text([(w.url, None)]) + "egress:\n  deny: [169.254.169.254/32]\n"
    good = write_config(tmp_path / "good.yaml", base)
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", good])
    assert rc == 0, (rc, out, err)
    meta = write_config(tmp_path / "meta.yaml", base.replace(
        '  - "%s"' % w.url,
        '  - {url: "%s", name: w1, lmcache: {endpoint: "http://169.254.169.254/lmcache"}}'
        % w.url))
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", meta])
    assert rc == 1, (rc, out, err)
    assert any("w1" in ln and "LMCache endpoint" in ln and "169.254.169.254/32" in ln
               for ln in (out + "\n" + err).splitlines()), (out, err)
    bad = write_config(tmp_path / "bad.yaml", base.replace(
        '  - "%s"' % w.url, '  - {url: "%s", name: w1, lmcache: {endpoint: "https://x/s"}}'
        % w.url))
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", bad])
    assert rc == 1 and "LMCache endpoint 'https://x/s' is malformed" in out + err, (out, err)

    lm = stub(name="lm")
    lm.config(lmcache=answer(0.1))
    conns = lm.log()["connections_accepted"]  # the test's own two so far
    worker = "http://localhost:%d" % w.port  # names: the load-time check cannot judge them
    endpoint = "http://localhost:%d" % lm.port
    text = (config_text([(worker, endpoint + STATUS)]) +
            'egress:\n  deny: [127.0.0.0/8, "::1/128"]\n')
    kv, _, _ = start(kvroute, tmp_path, text, admin=False)
    wait_until(lambda: kv.metrics().get("kvroute_egress_denied_total", endpoint=endpoint) >= 2,
               5, interval=0.05, what="denied lmcache polls counted")
    wait_polls(kv, worker, "error", 2)
    assert polls(kv, worker, "ok") == 0
    log = lm.log()
    # nothing reached it but the GET /stub/log just made
    assert log["lmcache_polls"] == 0 and log["connections_accepted"] == conns + 1, log
    assert "egress denied" in kv.proc.stderr_text()


def test_data_parallel_engine_polled_once_for_all_ranks(stub, kvroute, tmp_path):
    """A data-parallel engine's ranks share its LMCache endpoint: one poll per interval, through
    rank 0, sets every rank's occupancy (not one poll per rank)."""
    a = stub(name="a")
    a.config(lmcache=answer(0.3))
    text = config_text([]).rstrip("\n") + "\n" + (
        '  - {url: "%s", data_parallel_size: 4, lmcache: {endpoint: "%s"}}\n'
        % (a.url, a.url + STATUS))
    kv, adm, _ = start(kvroute, tmp_path, text)
    wait_polls(kv, a.url + "#0", "ok", n=5)
    m = kv.metrics()
    for r in range(4):
        assert m.get("kvroute_lmcache_occupancy", worker="%s#%d" % (a.url, r)) == 0.3
    for r in range(1, 4):
        assert not m.find("kvroute_lmcache_polls_total", worker="%s#%d" % (a.url, r))
    # the stub saw about as many polls as rank 0 counted, not four times as many
    assert a.log()["lmcache_polls"] <= m.get("kvroute_lmcache_polls_total",
                                             worker=a.url + "#0", result="ok") + 2
    # a failed answer turns every rank neutral
    a.config(lmcache_status=500)
    wait_polls(kv, a.url + "#0", "error")
    wait_until(lambda: not any(kv.metrics().find("kvroute_lmcache_occupancy",
                                                 worker="%s#%d" % (a.url, r))
                               for r in range(4)), 5.0, what="every rank neutral")
