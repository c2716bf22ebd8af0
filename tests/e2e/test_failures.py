"""Failures: the per-worker circuit breaker, active health thresholds and --forget-after-ms,
retries of requests that failed before any byte reached the client (x-kvroute-attempts,
kvroute_retries_total, the retry budget), streams cut after their first byte (a final SSE error
event, then the chunked terminator, the connection reusable) and the memory a request's body
holds once the worker answered.

Real processes on 127.0.0.1 only: kvroute-sim workers (faults through POST /sim/faults, SIGKILL,
SIGSTOP/SIGCONT), stub workers where a test must see exactly what a worker received, and one
in-test worker that holds 64 streams open cheaply. Small cooldowns and health intervals keep each
test within a few seconds; every wait is bounded; the machine may be loaded, so the assertions
are about behaviour (orderings, counts, lower bounds on gaps), with generous slack on speed.
"""
import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from conftest import (MODEL, SIM_MODEL, SSL_CTX, RawConn, assert_openai_error, chat_body,
                      free_port, http_post, sha256, wait_until)

P = "/v1/chat/completions"
MiB = 1 << 20


# ============================================================================ helpers
class Admin:
    """kvroute's admin listener (--admin-port)."""

    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def workers(self):
        r = httpx.get(self.base + "/workers", timeout=5.0, verify=SSL_CTX)
        assert r.status_code == 200, r.text
        return {w["url"]: w for w in r.json()["workers"]}


def with_admin(extra=()):
    """(admin port, extra flags with --admin-port)."""
    p = free_port()
    return p, ["--admin-port", p] + list(extra)


def sim_chat(content="hello", stream=False, max_tokens=8, **extra):
    b = {"model": SIM_MODEL, "messages": [{"role": "user", "content": content}],
         "max_tokens": max_tokens}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


def post(kv, body, headers=None, timeout=10.0):
    return kv.post(P, body, headers=headers, timeout=timeout)


def attempts(r):
    v = r.headers.get("x-kvroute-attempts")
    assert v is not None, "no x-kvroute-attempts on a proxied response: %r" % dict(r.headers)
    return int(v)


def worker_attempts(m, url):
    """Upstream attempts kvroute made on worker `url` (all status codes, 0 = no response)."""
    return m.get("kvroute_worker_requests_total", worker=url)


def breaker_state(m, url):
    found = m.find("kvroute_worker_breaker_state", worker=url)
    assert found, "no kvroute_worker_breaker_state{worker=%r}: %r" % (
        url, m.find("kvroute_worker_breaker_state"))
    return found[0][1]


def transitions(m, url, state=None):
    if state is None:
        return {lb["state"]: v for lb, v in m.find("kvroute_breaker_transitions_total", worker=url)}
    return m.get("kvroute_breaker_transitions_total", worker=url, state=state)


def healthy(kv, url):
    found = kv.metrics().find("kvroute_worker_healthy", worker=url)
    assert found, "no kvroute_worker_healthy{worker=%r}" % url
    return found[0][1]


def error_event(datas):
    """The final SSE event as an OpenAI error object (asserting it is one)."""
    assert datas, "empty stream"
    last = datas[-1]
    try:
        obj = json.loads(last)
    except Exception:
        raise AssertionError("the final event is not a JSON error: %r (previous %r)" % (
            last[:200], [d[:60] for d in datas[-3:-1]]))
    assert isinstance(obj, dict) and "error" in obj, "the final event is not an error: %r" % obj
    assert_openai_error(last.encode())
    assert "[DONE]" not in datas, "[DONE] before the error event: %r" % datas[-3:]
    return obj["error"]


def raw_exchange(port, body, headers=(), timeout=10.0, stream=None, on_event=None):
    """One request on a new raw connection. Returns a dict: status, headers (lower-case name →
    first value), and for SSE the event datas, `complete` (chunked terminator seen) and `events`
    arrival times; for JSON `body`. A read that did not end within `timeout` s sets `hung`."""
    if isinstance(body, dict):
        stream = body.get("stream") is True if stream is None else stream
        body = json.dumps(body).encode()
    out = {"status": None, "headers": {}, "datas": [], "times": [], "complete": False,
           "body": b"", "hung": False, "closed_early": False, "t0": time.monotonic()}
    with RawConn(port, timeout=timeout) as c:
        c.send(http_post(port, P, body, list(headers)))
        try:
            head = c.read_head(timeout=timeout)
            if head is None:
                out["closed_early"] = True
                return out
            out["status"] = head[0]
            out["t_head"] = time.monotonic()
            for k, v in head[3]:
                out["headers"].setdefault(k, v)
            ctype = out["headers"].get("content-type", "")
            if ctype.startswith("text/event-stream"):
                for t, ev, _ in c.iter_sse(head[3], timeout=timeout):
                    out["datas"].append(ev["data"])
                    out["times"].append(t)
                    if on_event:
                        on_event(out)
                out["complete"] = c.body_complete
            else:
                body_bytes = b"".join(chunk for _, chunk in c.iter_body(head[3], timeout))
                out["body"] = body_bytes
                out["complete"] = c.body_complete
        except TimeoutError:
            out["hung"] = True
    out["t1"] = time.monotonic()
    return out


# ============================================================================ 1. breaker on 500s
def test_breaker_opens_on_500s_one_trial_per_cooldown_then_closes(sim_factory, kvroute):
    """A worker answering 500 to every completion while its /health passes: every client
    request is still a 200 (retried on the other worker, x-kvroute-attempts: 2); after
    --breaker-failures (5) failures in a row the breaker opens, and from then on the worker gets
    exactly one trial per cooldown (1 s, then 2 s: doubled per re-open); a good trial closes it."""
    good = sim_factory("--time-scale", "0")
    bad = sim_factory("--time-scale", "0")
    bad.faults(fail_rate=1, fail_status=500)
    ap, extra = with_admin(["--breaker-cooldown-ms", 1000, "--breaker-max-cooldown-ms", 4000])
    kv = kvroute([good, bad], model=SIM_MODEL, health_interval_ms=200, extra=extra)
    adm = Admin(ap)
    assert adm.workers()[bad.url]["breaker"] == "closed", adm.workers()[bad.url]
    assert breaker_state(kv.metrics(), bad.url) == 0

    hits = []  # (t_sent, t_done) of the client requests that tried the bad worker first
    t_open = None
    t_start = time.monotonic()
    n = 0
    while time.monotonic() - t_start < 4.5 and n < 60:
        t0 = time.monotonic()
        r = post(kv, sim_chat("request %d" % n))
        t1 = time.monotonic()
        n += 1
        assert r.status_code == 200, "request %d: %d %r" % (n, r.status_code, r.text[:300])
        assert r.headers["x-kvroute-worker"] == good.url, r.headers
        a = attempts(r)
        assert a in (1, 2), a
        if a == 2:
            hits.append((t0, t1))
            if len(hits) == 5:
                t_open = t1
                # the 5th failure in a row opened it (verdict given when the 500's headers came)
                w = adm.workers()[bad.url]
                m = kv.metrics()
                if time.monotonic() - t_open < 0.8:  # the 1 s cooldown cannot be over yet
                    assert w["breaker"] == "open", w
                    assert w["eligible"] is False, w
                    assert breaker_state(m, bad.url) == 1
                else:  # a very slow machine: it may be half_open already
                    assert w["breaker"] in ("open", "half_open"), w
                    assert breaker_state(m, bad.url) in (1, 2)
                assert transitions(m, bad.url, "open") == 1, transitions(m, bad.url)
        time.sleep(0.08)
    assert t_open is not None, "the breaker never opened: %d requests, %d hit the bad worker" % (
        n, len(hits))
    m = kv.metrics()
    # every attempt on the bad worker is one client request with x-kvroute-attempts: 2
    assert worker_attempts(m, bad.url) == len(hits), (worker_attempts(m, bad.url), len(hits))
    assert m.get("kvroute_retries_total", model=SIM_MODEL, reason="http_500") == len(hits)
    assert m.get("kvroute_retries_total") == len(hits), m.find("kvroute_retries_total")
    # after opening: trials only, each one at least one cooldown after the previous verdict
    trials = hits[5:]
    assert trials, "no half-open trial within %.1fs of opening (cooldown 1 s)" % (
        time.monotonic() - t_open)
    # The previous failure's verdict came after its request was sent (t_sent); the trial
    # reached kvroute at least one cooldown after that verdict and was answered later still.
    prev_sent = hits[4][0]
    cooldown = 1.0
    for i, (t_sent, t_done) in enumerate(trials):
        assert t_done - prev_sent >= cooldown - 0.01, (
            "trial %d answered %.2fs after the previous failing request was sent; cooldown "
            "%.1fs (trials at %r s after opening)" % (
                i + 1, t_done - prev_sent, cooldown, [round(t - t_open, 2) for t, _ in trials]))
        prev_sent = t_sent
        cooldown = min(cooldown * 2, 4.0)
    tr = transitions(m, bad.url)
    assert tr.get("open") == 1 + len(trials), tr  # every failed trial re-opened it
    assert tr.get("half_open") in (len(trials), len(trials) + 1), tr
    assert tr.get("closed", 0) == 0, tr
    assert transitions(m, good.url) in ({}, {"closed": 0}), transitions(m, good.url)
    assert breaker_state(m, good.url) == 0

    # healed: the next trial succeeds and closes the breaker
    bad.faults(fail_rate=0)
    served = []

    def bad_serves():
        r = post(kv, sim_chat("after the fix"))
        assert r.status_code == 200 and attempts(r) == 1, (r.status_code, r.headers)
        served.append(r.headers["x-kvroute-worker"])
        return r.headers["x-kvroute-worker"] == bad.url or None
    wait_until(bad_serves, 12.0, interval=0.1, what="the healed worker to serve again")
    m = kv.metrics()
    assert breaker_state(m, bad.url) == 0
    assert transitions(m, bad.url, "closed") == 1, transitions(m, bad.url)
    w = adm.workers()[bad.url]
    assert w["breaker"] == "closed" and w["eligible"] is True, w
    kv.wait_inflight_zero()


def test_half_open_admits_exactly_one_trial_under_concurrency(sim_factory, kvroute):
    """Six clients at once; the bad worker takes 700 ms to answer 500. Once the breaker is open
    (and the attempts that started before have ended), the worker never has more than one
    request in flight: the half-open trial only, one per half-open period."""
    good = sim_factory("--time-scale", "0")
    bad = sim_factory("--time-scale", "0")
    bad.faults(fail_rate=1, fail_status=500, delay_ms=700)
    ap, extra = with_admin(["--breaker-failures", 2, "--breaker-cooldown-ms", 300,
                            "--breaker-max-cooldown-ms", 300])
    kv = kvroute([good, bad], model=SIM_MODEL, health_interval_ms=200, extra=extra)
    adm = Admin(ap)
    table_states = []
    stop = threading.Event()
    lock = threading.Lock()
    statuses = []

    def client(k):
        i = 0
        while not stop.is_set():
            try:
                r = post(kv, sim_chat("client %d request %d" % (k, i)), timeout=10)
                st = (r.status_code, r.headers.get("x-kvroute-attempts"))
            except Exception as e:  # noqa: BLE001 - asserted below
                st = repr(e)
            with lock:
                statuses.append(st)
            i += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(6)]
    samples = []  # (t, inflight on bad, breaker state)
    for t in threads:
        t.start()
    try:
        t_open = None
        mark = None
        t_end = time.monotonic() + 12.0
        while time.monotonic() < t_end:
            m = kv.metrics()
            now = time.monotonic()
            infl = m.get("kvroute_worker_inflight", worker=bad.url)
            st = breaker_state(m, bad.url)
            samples.append((now, infl, st))
            if st == 2 and not table_states:
                table_states.append(adm.workers()[bad.url]["breaker"])
            if t_open is None and transitions(m, bad.url, "open") >= 1:
                t_open = now
            if t_open is not None and mark is None and now > t_open + 1.0:
                mark = (worker_attempts(m, bad.url), transitions(m, bad.url, "half_open"))
            if t_open is not None and now > t_open + 4.0:
                break
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert t_open is not None, "the breaker never opened"
    assert mark is not None
    m = kv.metrics()
    late = [(round(t - t_open, 2), n, st) for t, n, st in samples if t > t_open + 1.0]
    assert late, samples[-5:]
    over = [x for x in late if x[1] > 1]
    assert not over, "more than one request in flight on an open/half-open worker: %r" % over[:5]
    attempts_after = worker_attempts(m, bad.url) - mark[0]
    trials_after = transitions(m, bad.url, "half_open") - mark[1]
    assert trials_after >= 1, transitions(m, bad.url)
    assert attempts_after <= trials_after + 1, (
        "%d attempts on the bad worker for %d half-open periods" % (attempts_after, trials_after))
    assert any(n == 1 for _, n, _ in late), "no trial seen in flight"
    assert any(st == 2 for _, _, st in late), "kvroute_worker_breaker_state never showed 2"
    # /workers read just after the gauge said half_open (the 700 ms trial was running)
    assert table_states and table_states[0] in ("half_open", "open"), table_states
    bad_st = [st for st in statuses if st[0] != 200]
    assert not bad_st, bad_st[:5]
    kv.wait_inflight_zero(timeout=5)


# ============================================================================ 2. worker killed
def test_worker_killed_during_replay(procs, sim_factory, kvroute):
    """Threads replay JSON and SSE requests through three sims; one is SIGKILLed while streams
    run on it. JSON requests all succeed (retried); its started streams end with an SSE error
    event and the chunked terminator (never a hang); once kvroute knows it is dead it gets no
    attempt; restarted on the same port it rejoins within two health intervals (+ slack)."""
    a = sim_factory("--time-scale", "1")
    b = sim_factory("--time-scale", "1")
    victim_port = free_port()
    c = sim_factory("--time-scale", "1", "--port", victim_port)
    assert c.port == victim_port
    interval = 0.3
    kv = kvroute([a, b, c], model=SIM_MODEL, health_interval_ms=int(interval * 1000),
                 extra=["--breaker-cooldown-ms", 500, "--breaker-max-cooldown-ms", 1000])

    stop = threading.Event()
    lock = threading.Lock()
    records = []
    victim_stream = threading.Event()

    def on_event(rec):
        if rec["headers"].get("x-kvroute-worker") == c.url and len(rec["datas"]) >= 2:
            victim_stream.set()

    def replay(tid):
        i = 0
        while not stop.is_set():
            stream = i % 2 == 1
            body = sim_chat("thread %d request %d" % (tid, i), stream=stream,
                            max_tokens=150 if stream else 8)
            try:
                rec = raw_exchange(kv.port, body, timeout=10.0, on_event=on_event)
            except Exception as e:  # noqa: BLE001 - recorded, asserted below
                rec = {"exc": repr(e)}
            rec["stream"] = stream
            with lock:
                records.append(rec)
            i += 1

    threads = [threading.Thread(target=replay, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(victim_stream.is_set, 10.0, interval=0.01, what="a stream running on the victim")
        t_kill = time.monotonic()
        c.proc.kill()
        # SIGKILLed on purpose: its exit status is not a clean SIGTERM exit
        procs.sims.remove(c)
        c.client.close()
        # known dead: unhealthy (a refused connect marks it at once) and nothing in flight there
        wait_until(lambda: healthy(kv, c.url) == 0 and kv.inflight().get(c.url) == 0, 5.0,
                   interval=0.02, what="kvroute to see the victim dead")
        dead_attempts = worker_attempts(kv.metrics(), c.url)
        time.sleep(2.0)  # the replay goes on without it
    finally:
        stop.set()
        for t in threads:
            t.join(15.0)
    assert not any(t.is_alive() for t in threads), "a replay thread hung"
    m = kv.metrics()
    assert worker_attempts(m, c.url) == dead_attempts, (
        "the dead worker was still tried after it was known dead: %r → %r" % (
            dead_attempts, worker_attempts(m, c.url)))

    exc = [r for r in records if "exc" in r]
    assert not exc, exc[:3]
    hung = [r for r in records if r["hung"] or r["closed_early"]]
    assert not hung, "responses that hung or closed before a status line: %r" % hung[:3]
    jsons = [r for r in records if not r["stream"]]
    streams = [r for r in records if r["stream"]]
    assert len(jsons) >= 4 and len(streams) >= 4, (len(jsons), len(streams))
    bad_json = [(r["status"], r["headers"], r["body"][:200]) for r in jsons if r["status"] != 200]
    assert not bad_json, "non-streaming requests failed: %r" % bad_json[:3]
    for r in jsons:
        assert r["complete"], r
        assert json.loads(r["body"])["object"] == "chat.completion"
        assert r["headers"].get("x-kvroute-attempts") in ("1", "2", "3"), r["headers"]
    cut = []
    for r in streams:
        assert r["status"] == 200, r
        assert "x-kvroute-attempts" in r["headers"], r["headers"]
        assert r["complete"], "a stream did not end with the chunked terminator: %r" % (
            r["datas"][-2:],)
        w = r["headers"]["x-kvroute-worker"]
        if r["datas"] and r["datas"][-1] == "[DONE]":
            continue
        # only streams of the killed worker may end otherwise, and then with an error event
        assert w == c.url, "a stream of a live worker (%s) did not end with [DONE]: %r" % (
            w, r["datas"][-2:])
        assert r["t_head"] < t_kill + 0.5, r
        error_event(r["datas"])
        cut.append(r)
    assert cut, "no stream of the killed worker ended with an error event"
    # every JSON request that began on the victim after the kill was retried elsewhere
    assert all(r["headers"]["x-kvroute-worker"] != c.url for r in jsons if r["t0"] > t_kill + 0.2)

    # restarted on the same port: healthy within two intervals (+ slack), then served again
    c2 = sim_factory("--time-scale", "1", "--port", victim_port)
    t_up = time.monotonic()
    wait_until(lambda: healthy(kv, c.url) == 1, 2 * interval + 3.0, interval=0.02,
               what="the restarted worker to be healthy")
    took = time.monotonic() - t_up
    assert took <= 2 * interval + 1.5, "rejoined %.2fs after restart (2 intervals = %.1fs)" % (
        took, 2 * interval)

    def victim_serves():
        r = post(kv, sim_chat("after restart"))
        assert r.status_code == 200, r.text
        return r.headers["x-kvroute-worker"] == c2.url or None
    wait_until(victim_serves, 8.0, interval=0.05, what="the restarted worker to get requests")
    kv.wait_inflight_zero()


def test_unreachable_worker_opens_its_breaker_without_health_checks(stub, kvroute):
    """Health checks off: a refused worker is tried by 5 requests (each retried elsewhere),
    then its breaker opens and it gets no more attempts during the cooldown."""
    dead = "http://127.0.0.1:%d" % free_port()
    live = stub()
    kv = kvroute([dead, live], health_interval_ms=0,
                 extra=["--breaker-failures", 5, "--breaker-cooldown-ms", 60000])
    n2 = 0
    for i in range(20):
        r = kv.chat(content="dead %d" % i)
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == live.url, r.headers
        n2 += attempts(r) == 2
    m = kv.metrics()
    assert n2 == 5, n2
    assert m.get("kvroute_upstream_errors_total", worker=dead, kind="connect") == 5
    assert m.get("kvroute_retries_total", reason="connect") == 5
    assert breaker_state(m, dead) == 1
    assert transitions(m, dead) == {"open": 1}, transitions(m, dead)
    kv.wait_inflight_zero()


def test_requests_wait_for_the_half_open_trial(stub, kvroute):
    """The only worker's breaker half-open, its trial running: requests that arrive meanwhile
    wait in the queue for the trial's answer, and are served once it starts well (not 503
    no_eligible_worker while the fleet recovers). A failed trial opens the breaker again, and
    those waiting get their 503 then."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0,
                 extra=["--breaker-failures", 1, "--breaker-cooldown-ms", 300,
                        "--breaker-max-cooldown-ms", 300])

    def open_then_half_open():
        r = kv.chat(content="fail", headers={"x-stub-mode": "fail:500"})
        assert r.status_code == 500, r.text
        wait_until(lambda: breaker_state(kv.metrics(), w.url) == 2, 5, what="half_open")
        w.reset()

    for trial_mode, want in (("delay:600", 200), ("delay:600,fail:503", 503)):
        open_then_half_open()
        out = {}

        def send(k, mode=None):
            out[k] = kv.chat(content="r%s" % k, timeout=10,
                             headers={"x-stub-mode": mode} if mode else None)
        trial = threading.Thread(target=send, args=("trial", trial_mode))
        trial.start()
        wait_until(lambda: len(w.proxied()) == 1, 5, what="the trial at the worker")
        others = [threading.Thread(target=send, args=(k,)) for k in range(3)]
        for t in others:
            t.start()
        for t in [trial] + others:
            t.join(15)
        assert out["trial"].status_code == want, out["trial"].text
        for k in range(3):
            r = out[k]
            assert r.status_code == want, (trial_mode, r.status_code, r.text)
            if want == 503:
                assert r.json()["error"]["code"] == "no_eligible_worker", r.text
        got = w.proxied()
        if want == 200:
            # the waiting ones reached the worker only after the trial's answer started
            assert len(got) == 4, got
            t_trial = got[0]["t_headers_sent"]
            assert all(e["t_start"] >= t_trial for e in got[1:]), got
            assert breaker_state(kv.metrics(), w.url) == 0
        else:
            assert len(got) == 1, got  # the trial only
            assert breaker_state(kv.metrics(), w.url) in (1, 2)
    kv.wait_inflight_zero()


def test_failed_trial_retry_waits_for_the_other_trial(stub, kvroute):
    """Both workers half-open, one trial each: the one that fails is not relayed while the
    other worker's trial runs; its request waits for that verdict and is served there."""
    a, b = stub(), stub()
    kv = kvroute([a, b], health_interval_ms=0,
                 extra=["--breaker-failures", 1, "--breaker-cooldown-ms", 300,
                        "--breaker-max-cooldown-ms", 300])
    r = kv.chat(content="fail both", headers={"x-stub-mode": "fail:500"})
    assert r.status_code == 500 and attempts(r) == 2, (r.status_code, r.headers)
    wait_until(lambda: breaker_state(kv.metrics(), a.url) == 2 and
               breaker_state(kv.metrics(), b.url) == 2, 5, what="both half_open")
    a.reset()
    b.reset()
    a.config(mode="delay:300,fail:500")
    b.config(mode="delay:800")
    out = {}

    def send(k):
        out[k] = kv.chat(content="recovering %d" % k, timeout=10)
    ts = [threading.Thread(target=send, args=(k,)) for k in range(2)]
    for k, t in enumerate(ts):
        t.start()
        wait_until(lambda: len(a.proxied()) + len(b.proxied()) == k + 1, 5,
                   what="trial %d at its worker" % k)
    for t in ts:
        t.join(15)
    for k in range(2):
        assert out[k].status_code == 200, out[k].text
        assert out[k].headers["x-kvroute-worker"] == b.url, out[k].headers
    assert sorted(attempts(out[k]) for k in range(2)) == [1, 2]
    got = b.proxied()
    assert len(got) == 2 and len(a.proxied()) == 1, (got, a.proxied())
    assert got[1]["t_start"] >= got[0]["t_headers_sent"]  # the retry waited for b's trial
    kv.wait_inflight_zero()


def test_attempt_on_a_worker_that_turns_unhealthy_is_retried_at_once(stub, kvroute):
    """A worker that takes a request and never answers (a stopped engine) holds it only until
    its health checks fail: the attempt is then failed as a first-byte timeout and retried on
    a healthy worker, long before --first-byte-timeout-ms."""
    stuck, live = stub(), stub()
    stuck.config(mode="hang")
    admin = free_port()
    kv = kvroute([stuck.url, live.url], health_interval_ms=100,
                 extra=["--unhealthy-threshold", 2, "--admin-port", admin])
    wname = live.url.replace(":", "%3A").replace("/", "%2F")
    base = "http://127.0.0.1:%d/workers/%s" % (admin, wname)
    assert httpx.post(base + "/drain", timeout=5.0).status_code == 200  # the request goes to stuck
    out = {}

    def send():
        out["r"] = kv.chat(content="who answers", timeout=20)
    t = threading.Thread(target=send)
    t.start()
    wait_until(lambda: len(stuck.proxied()) == 1, 5, what="the request at the stuck worker")
    assert httpx.post(base + "/undrain", timeout=5.0).status_code == 200
    t0 = time.monotonic()
    stuck.config(health_status=503)
    t.join(15)
    assert not t.is_alive()
    r = out["r"]
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-worker"] == live.url
    assert time.monotonic() - t0 < 5
    m = kv.metrics()
    assert m.get("kvroute_upstream_errors_total", worker=stuck.url, kind="first_byte_timeout") == 1
    kv.wait_inflight_zero()


# ============================================================================ 3. 4xx, aborts
def test_4xx_relayed_once_and_never_trip_the_breaker(stub, kvroute):
    """Ten requests answered 400: relayed unchanged (status and body bytes), tried once each,
    never retried; the breaker (2 failures would open it) stays closed."""
    a, b = stub(), stub()
    ap, extra = with_admin(["--breaker-failures", 2, "--breaker-cooldown-ms", 500])
    kv = kvroute([a, b], health_interval_ms=200, extra=extra)
    want = json.dumps({"error": {"message": "stub failure (requested)", "type": "stub_error",
                                 "param": None, "code": 400}}).encode()
    got = []
    for i in range(10):
        r = kv.chat(headers={"x-stub-mode": "fail:400"}, content="bad request %d" % i)
        assert r.status_code == 400, (r.status_code, r.text)
        assert r.content == want, r.content
        assert r.headers.get("content-type") == "application/json", r.headers
        assert attempts(r) == 1
        got.append((r.headers["x-kvroute-worker"], r.headers["x-stub-seq"], sha256(r.content)))
    logs = {w.url: w.proxied() for w in (a, b)}
    assert sum(len(v) for v in logs.values()) == 10, {k: len(v) for k, v in logs.items()}
    for url, seq, digest in got:  # each reply is the bytes that worker sent for that request
        e = [x for x in logs[url] if str(x["seq"]) == seq]
        assert len(e) == 1 and e[0]["status"] == 400, e
        assert e[0]["resp_body_sha256"] == digest, e[0]
    m = kv.metrics()
    for w in (a, b):
        assert breaker_state(m, w.url) == 0
        assert sum(transitions(m, w.url).values()) == 0, transitions(m, w.url)
        assert Admin(ap).workers()[w.url]["breaker"] == "closed"
    assert m.get("kvroute_retries_total") == 0, m.find("kvroute_retries_total")
    kv.wait_inflight_zero()


def test_client_aborts_never_trip_the_breaker(stub, kvroute):
    w = stub(events=50, interval_ms=50)
    kv = kvroute([w], health_interval_ms=200, extra=["--breaker-failures", 2])
    body = json.dumps(chat_body(stream=True)).encode()
    for _ in range(4):
        with RawConn(kv.port, timeout=5) as c:
            c.send(http_post(kv.port, P, body))
            head = c.read_head()
            assert head and head[0] == 200
            for n, _ in enumerate(c.iter_sse(head[3], timeout=5)):
                if n == 1:
                    break
        # closed mid-stream by the client
    wait_until(lambda: sum(1 for e in w.proxied() if e["client_gone"]) == 4, 5.0,
               what="the worker to see four aborts")
    kv.wait_inflight_zero()
    m = kv.metrics()
    assert breaker_state(m, w.url) == 0
    assert sum(transitions(m, w.url).values()) == 0, transitions(m, w.url)
    assert kv.chat().status_code == 200


# ============================================================================ 4. SIGSTOP
def test_stopped_worker_hits_first_byte_timeout_and_rejoins(sim_factory, kvroute):
    a = sim_factory("--time-scale", "0")
    b = sim_factory("--time-scale", "0")
    kv = kvroute([a, b], model=SIM_MODEL, health_interval_ms=500,
                 extra=["--first-byte-timeout-ms", 500, "--breaker-cooldown-ms", 500,
                        "--breaker-max-cooldown-ms", 1000])
    for i in range(4):  # warm: both serve
        assert post(kv, sim_chat("warm %d" % i)).status_code == 200
    os.kill(a.pid, signal.SIGSTOP)
    try:
        retried = []
        for i in range(6):
            t0 = time.monotonic()
            r = post(kv, sim_chat("while stopped %d" % i), timeout=15)
            took = time.monotonic() - t0
            assert r.status_code == 200, (r.status_code, r.text[:300])
            assert r.headers["x-kvroute-worker"] == b.url, r.headers
            if attempts(r) == 2:
                assert took >= 0.45, "retried after %.2fs; the first-byte deadline is 0.5 s" % took
                retried.append(took)
            else:
                assert attempts(r) == 1
            if len(retried) >= 1 and i >= 1:
                break
        assert retried, "no request went to the stopped worker first"
        m = kv.metrics()
        assert m.get("kvroute_retries_total", model=SIM_MODEL,
                     reason="first_byte_timeout") == len(retried), m.find("kvroute_retries_total")
        assert m.get("kvroute_upstream_errors_total", worker=a.url,
                     kind="first_byte_timeout") >= len(retried)
        # health probes get no answer either: unhealthy after two of them
        wait_until(lambda: healthy(kv, a.url) == 0, 6.0, interval=0.05,
                   what="the stopped worker to be marked unhealthy")
        for i in range(3):
            r = post(kv, sim_chat("while down %d" % i))
            assert r.status_code == 200 and attempts(r) == 1
            assert r.headers["x-kvroute-worker"] == b.url
    finally:
        os.kill(a.pid, signal.SIGCONT)

    def a_serves():
        r = post(kv, sim_chat("after SIGCONT"))
        assert r.status_code == 200, r.text
        return r.headers["x-kvroute-worker"] == a.url or None
    wait_until(a_serves, 10.0, interval=0.1, what="the resumed worker to get requests again")
    assert healthy(kv, a.url) == 1
    kv.wait_inflight_zero()


# ============================================================================ 5. memory
class HoldingWorker:
    """A worker in this process that costs little memory per request: it reads each request
    body into a scratch buffer (discarding it), answers SSE at once, then sends an event every
    200 ms until `release` is set (requests with `x-hold: 1`; others end after one event)."""

    def __init__(self):
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(256)
        self.srv.settimeout(0.2)
        self.port = self.srv.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.release = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.bodies = []  # body lengths received
        self.errors = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(c,), daemon=True).start()
        self.srv.close()

    @staticmethod
    def _chunk(b):
        return b"%x\r\n%s\r\n" % (len(b), b)

    def _handle(self, c):
        scratch = bytearray(MiB)
        view = memoryview(scratch)
        buf = b""
        try:
            c.settimeout(60)
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                hdrs = {}
                for ln in lines[1:]:
                    k, _, v = ln.partition(b":")
                    hdrs[k.strip().lower()] = v.strip()
                if not lines[0].startswith(b"POST"):
                    c.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    continue
                n = int(hdrs.get(b"content-length", b"0"))
                got = min(n, len(buf))
                buf = buf[got:]
                while got < n:
                    k = c.recv_into(view, min(MiB, n - got))
                    if not k:
                        return
                    got += k
                with self.lock:
                    self.bodies.append(n)
                ev = b'data: {"id":"hold","object":"chat.completion.chunk","choices":[]}\n\n'
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                          b"transfer-encoding: chunked\r\n\r\n" + self._chunk(ev))
                if hdrs.get(b"x-hold") == b"1":
                    while not self.release.wait(0.2):
                        if self.stop.is_set():
                            return
                        c.sendall(self._chunk(ev))
                c.sendall(self._chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        except OSError as e:
            with self.lock:
                self.errors.append(repr(e))
        finally:
            c.close()

    def close(self):
        self.release.set()
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def holding_worker():
    w = HoldingWorker()
    yield w
    w.close()


def test_request_bodies_are_freed_once_the_worker_answered(kvroute, holding_worker):
    """64 concurrent requests of ~8 MiB each whose streams stay open: once all their headers
    arrived, kvroute's RSS is within 64 MiB of its idle RSS (the bodies, 512 MiB, are freed)."""
    from conftest import KVROUTE_BIN
    if b"__asan_init" in KVROUTE_BIN.read_bytes():
        pytest.skip("an ASan build keeps freed memory in its quarantine: RSS says nothing here")
    w = holding_worker
    n, size = 64, 8 * MiB
    kv = kvroute([w.url], health_interval_ms=0,
                 extra=["--max-body-bytes", 16 * MiB, "--max-total-body-bytes", 1 << 30,
                        "--scrape-interval", 0])
    # warm up (a small streamed request), then idle
    r = raw_exchange(kv.port, chat_body(stream=True), timeout=10)
    assert r["status"] == 200 and r["datas"][-1] == "[DONE]", r
    time.sleep(0.3)
    idle = kv.rss_bytes()
    del w.bodies[:]

    prompt = "x" * (size - 200)
    bodies = [json.dumps(chat_body(stream=True, content="%03d " % i + prompt)).encode()
              for i in range(4)]
    heads = []
    results = [None] * n
    lock = threading.Lock()
    all_heads = threading.Event()

    def client(i):
        body = bodies[i % len(bodies)]
        res = {"status": None, "datas": [], "complete": False}
        results[i] = res
        try:
            with RawConn(kv.port, timeout=40) as c:
                c.send(http_post(kv.port, P, b"", ["x-hold: 1"]).replace(
                    b"Content-Length: 0", b"Content-Length: %d" % len(body)))
                c.send(body)
                head = c.read_head(timeout=40)
                if head is None:
                    res["error"] = "closed before a status line"
                    return
                res["status"] = head[0]
                with lock:
                    heads.append(i)
                    if len(heads) == n:
                        all_heads.set()
                for _, ev, _ in c.iter_sse(head[3], timeout=40):
                    res["datas"].append(ev["data"])
                res["complete"] = c.body_complete
        except Exception as e:  # noqa: BLE001 - asserted below
            res["error"] = repr(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        if not all_heads.wait(40):
            errs = [r for r in results if r and r.get("error")]
            raise AssertionError("only %d of %d streams got their headers (errors %r)" % (
                len(heads), n, errs[:3]))
        assert len(w.bodies) == n and set(w.bodies) == {len(bodies[0])}, (len(w.bodies), w.bodies[:3])
        assert kv.inflight().get(w.url) == n, kv.inflight()
        time.sleep(0.3)
        samples = []
        for _ in range(5):
            samples.append(kv.rss_bytes())
            time.sleep(0.1)
        held = max(samples) - idle
        assert held <= 64 * MiB, (
            "kvroute holds %.1f MiB above idle (%.1f MiB) with %d open streams whose %d MiB "
            "bodies were all sent (samples %r MiB)" % (
                held / MiB, idle / MiB, n, size // MiB, [round(s / MiB, 1) for s in samples]))
    finally:
        w.release.set()
        for t in threads:
            t.join(30)
    bad = [r for r in results if not r or r.get("error") or r["status"] != 200
           or not r["complete"] or r["datas"][-1:] != ["[DONE]"]]
    assert not bad, bad[:3]
    assert not w.errors, w.errors[:3]
    kv.wait_inflight_zero(timeout=10)


# ============================================================================ 6. health
def health_checks(w):
    return w.log()["health_checks"]


def after_next_check(w, timeout=5.0):
    """Waits for the stub's next health check and returns its count (the next one is about one
    interval away)."""
    n0 = health_checks(w)
    return wait_until(lambda: health_checks(w) > n0 and health_checks(w), timeout, interval=0.01,
                      what="a health check")


def test_health_thresholds(stub, kvroute):
    """One failed check (threshold 2) changes nothing; two in a row make the worker unhealthy
    (no requests); two passes in a row make it healthy again."""
    a, b = stub(), stub()
    kv = kvroute([a, b], health_interval_ms=300,
                 extra=["--unhealthy-threshold", 2, "--healthy-threshold", 2,
                        "--breaker-failures", 0])
    wait_until(lambda: health_checks(a) >= 2, 5.0, what="health checks")
    assert healthy(kv, a.url) == 1

    # one failure only
    for attempt in range(3):
        c0 = after_next_check(a)
        a.config(health_status=503)
        c1 = wait_until(lambda: health_checks(a) > c0 and health_checks(a), 3.0, interval=0.005,
                        what="one failing check")
        a.config(health_status=200)
        if health_checks(a) == c0 + 1 == c1:
            break  # exactly one check saw 503
    else:
        pytest.fail("could not make exactly one health check fail (checks too close together)")
    t_end = time.monotonic() + 1.2  # four more intervals
    while time.monotonic() < t_end:
        assert healthy(kv, a.url) == 1, "unhealthy after a single failed check"
        time.sleep(0.05)
    assert "worker unhealthy" not in kv.proc.stderr_text()

    # several failures: unhealthy only from the second failing check on
    c0 = after_next_check(a)
    a.config(health_status=503)
    deadline = time.monotonic() + 5.0
    while True:
        h = healthy(kv, a.url)
        n = health_checks(a)  # read after: never fewer than kvroute has seen
        if h == 0:
            assert n >= c0 + 2, "unhealthy after %d failed check(s)" % (n - c0)
            break
        assert time.monotonic() < deadline, "still healthy after %d failed checks" % (n - c0)
        time.sleep(0.02)
    seen = len(a.proxied())
    for i in range(4):
        r = kv.chat(content="while a is down %d" % i)
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == b.url, r.headers
    assert len(a.proxied()) == seen

    # back: healthy only from the second passing check on
    c0 = after_next_check(a)
    a.config(health_status=200)
    deadline = time.monotonic() + 5.0
    while True:
        h = healthy(kv, a.url)
        n = health_checks(a)
        if h == 1:
            assert n >= c0 + 2, "healthy again after %d passed check(s)" % (n - c0)
            break
        assert time.monotonic() < deadline, "still unhealthy after %d passed checks" % (n - c0)
        time.sleep(0.02)
    served = {kv.chat(content="back %d" % i).headers["x-kvroute-worker"] for i in range(4)}
    assert a.url in served, served
    kv.wait_inflight_zero()


def test_session_survives_short_outage_not_one_past_forget_after(stub, kvroute):
    forget_ms = 1500
    a, b = stub(), stub()
    ap, extra = with_admin(["--forget-after-ms", forget_ms, "--breaker-failures", 0])
    kv = kvroute([a, b], policy="cache_aware", health_interval_ms=100, extra=extra)
    adm = Admin(ap)
    sid = {"x-session-id": "failures-session-1"}
    r = kv.chat(headers=sid, content="turn one of a session")
    assert r.status_code == 200
    owner_url = r.headers["x-kvroute-worker"]
    owner = a if owner_url == a.url else b
    r = kv.chat(headers=sid, content="turn two, another text")
    assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
    assert r.headers["x-kvroute-worker"] == owner.url
    assert adm.workers()[owner.url]["sessions"] == 1
    blocks = adm.workers()[owner.url]["index_blocks"]
    assert blocks > 0, adm.workers()[owner.url]

    def outage(hold_s):
        owner.config(health_status=503)
        wait_until(lambda: healthy(kv, owner.url) == 0, 5.0, interval=0.01, what="unhealthy")
        t_down = time.monotonic()
        time.sleep(hold_s)
        owner.config(health_status=200)
        wait_until(lambda: healthy(kv, owner.url) == 1, 5.0, interval=0.01, what="healthy again")
        return time.monotonic() - t_down

    # a short outage: the session (and what the index learned) survive
    down = outage(0.1)
    assert down < forget_ms / 1000.0 - 0.3, "the short outage lasted %.2fs (forget after %.1fs)" % (
        down, forget_ms / 1000.0)
    w = adm.workers()[owner.url]
    assert w["sessions"] == 1 and w["index_blocks"] == blocks, (blocks, w)
    r = kv.chat(headers=sid, content="turn three after a blip")
    assert r.status_code == 200
    assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
    assert r.headers["x-kvroute-worker"] == owner.url
    assert "forgetting" not in kv.proc.stderr_text()

    # an outage longer than --forget-after-ms: the session is gone
    down = outage(forget_ms / 1000.0 + 0.5)
    assert down > forget_ms / 1000.0
    w = adm.workers()[owner.url]
    assert w["sessions"] == 0 and w["index_blocks"] == 0, w
    r = kv.chat(headers=sid, content="turn four after a long outage")
    assert r.status_code == 200
    assert r.headers["x-kvroute-decision"] != "session_id_match", r.headers
    kv.wait_inflight_zero()


def test_restart_seen_in_start_time_forgets_sessions(procs, sim_factory, kvroute):
    """A worker down for less than --forget-after-ms keeps its sessions, unless it came back as
    a new process (process_start_time_seconds changed, seen by the /metrics scrape)."""
    ports = [free_port(), free_port()]
    sims = [sim_factory("--time-scale", "0", "--port", p) for p in ports]
    ap, extra = with_admin(["--scrape-interval", 1, "--forget-after-ms", 30000])
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=100,
                 extra=extra)
    adm = Admin(ap)
    wait_until(lambda: "worker KV capacity" in kv.proc.stderr_text(), 5.0,
               what="a first scrape")
    time.sleep(1.2)  # every worker scraped once (its start time known)
    sid = {"x-session-id": "restart-session"}
    r = post(kv, sim_chat("first turn"), headers=sid)
    assert r.status_code == 200
    owner = next(s for s in sims if s.url == r.headers["x-kvroute-worker"])
    r = post(kv, sim_chat("second turn"), headers=sid)
    assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
    owner.proc.kill()
    procs.sims.remove(owner)  # SIGKILLed on purpose
    owner.client.close()
    wait_until(lambda: healthy(kv, owner.url) == 0, 5.0, what="the owner marked down")
    time.sleep(0.3)
    assert adm.workers()[owner.url]["sessions"] == 1, "sessions dropped after a short outage"
    sim_factory("--time-scale", "0", "--port", owner.port)
    wait_until(lambda: healthy(kv, owner.url) == 1, 5.0, what="the restarted owner healthy")
    wait_until(lambda: adm.workers()[owner.url]["sessions"] == 0, 5.0, interval=0.05,
               what="the restart to be seen (start time scraped) and the session dropped")
    r = post(kv, sim_chat("third turn"), headers=sid)
    assert r.status_code == 200
    assert r.headers["x-kvroute-decision"] != "session_id_match", r.headers
    kv.wait_inflight_zero()


# ============================================================================ 7. retry budget
def test_retry_budget_zero_allows_only_the_per_second_allowance(sim_factory, kvroute):
    """--retry-budget 0: only the fixed allowance of 3 retries per second over the 10 s window
    (30) is left. Both workers answer 500, so a retried request is a 500 after 2 attempts (never
    3: a worker is not tried twice) and later ones are relayed after 1."""
    s1 = sim_factory("--time-scale", "0")
    s2 = sim_factory("--time-scale", "0")
    for s in (s1, s2):
        s.faults(fail_rate=1, fail_status=500)
    kv = kvroute([s1, s2], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--retry-budget", 0, "--breaker-failures", 0, "--max-retries", 2])
    t0 = time.monotonic()
    seq = []
    for i in range(45):
        r = post(kv, sim_chat("budget %d" % i))
        assert r.status_code == 500, (r.status_code, r.text[:200])
        err = assert_openai_error(r)
        assert err["code"] == "injected_failure", err  # the worker's own answer, as sent
        seq.append(attempts(r))
    took = time.monotonic() - t0
    m = kv.metrics()
    retries = m.get("kvroute_retries_total", model=SIM_MODEL, reason="http_500")
    assert retries == seq.count(2), (retries, seq)
    assert set(seq) <= {1, 2}, seq
    if took < 9.0:  # all inside one 10 s window
        assert seq == [2] * 30 + [1] * 15, seq
    else:
        assert 30 <= retries <= 30 + 3 * (took - 9.0) + 3, (retries, took, seq)
    assert worker_attempts(m, s1.url) + worker_attempts(m, s2.url) == 45 + retries
    kv.wait_inflight_zero()


def test_retry_budget_share(sim_factory, kvroute):
    """--retry-budget 0.5: after each request k, the retries so far stay within 0.5 k + 30
    (the 3/s allowance over 10 s), and a request is relayed unretried only once that is used."""
    s1 = sim_factory("--time-scale", "0")
    s2 = sim_factory("--time-scale", "0")
    for s in (s1, s2):
        s.faults(fail_rate=1, fail_status=503)
    kv = kvroute([s1, s2], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--retry-budget", 0.5, "--breaker-failures", 0])
    t0 = time.monotonic()
    retries = 0
    seq = []
    for k in range(1, 101):
        r = post(kv, sim_chat("share %d" % k))
        assert r.status_code == 503, (r.status_code, r.text[:200])
        a = attempts(r)
        seq.append(a)
        if a == 2:
            retries += 1
            assert retries <= 0.5 * k + 30 + 1, (k, retries, seq)
        else:
            assert a == 1
            assert retries >= 0.5 * k + 30 - 1, (
                "request %d not retried with only %d retries so far" % (k, retries))
    took = time.monotonic() - t0
    if took < 9.0:
        assert seq.count(1) >= 15, seq  # the budget did bind
    assert kv.metrics().get("kvroute_retries_total", reason="http_503") == retries
    kv.wait_inflight_zero()


def test_max_retries_zero_relays_the_500(sim_factory, kvroute):
    good = sim_factory("--time-scale", "0")
    bad = sim_factory("--time-scale", "0")
    bad.faults(fail_rate=1, fail_status=500)
    kv = kvroute([good, bad], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--max-retries", 0, "--breaker-failures", 0])
    seen = {}
    for i in range(6):
        r = post(kv, sim_chat("no retries %d" % i))
        assert attempts(r) == 1, r.headers
        w = r.headers["x-kvroute-worker"]
        seen[w] = seen.get(w, 0) + 1
        if w == bad.url:
            assert r.status_code == 500
            assert assert_openai_error(r)["code"] == "injected_failure"
        else:
            assert r.status_code == 200
    assert seen.get(bad.url) and seen.get(good.url), seen
    assert kv.metrics().get("kvroute_retries_total") == 0
    kv.wait_inflight_zero()


def test_every_attempt_refused_gives_502_naming_the_cause(kvroute):
    dead = ["http://127.0.0.1:%d" % free_port() for _ in range(3)]
    kv = kvroute(dead, health_interval_ms=0, extra=["--max-retries", 2, "--breaker-failures", 0])
    r = kv.chat()
    err = assert_openai_error(r, 502)
    assert attempts(r) == 3, r.headers
    assert "connect" in err["message"], err
    m = kv.metrics()
    assert m.get("kvroute_retries_total", reason="connect") == 2, m.find("kvroute_retries_total")
    for u in dead:  # each worker tried once
        assert m.get("kvroute_upstream_errors_total", worker=u, kind="connect") == 1
    kv.wait_inflight_zero()


@pytest.mark.parametrize("status", [502, 503, 504, 501])
def test_retryable_statuses(sim_factory, kvroute, status):
    """500/502/503/504 from a worker are retried on the other one (reason http_<status>); any
    other 5xx (501) is relayed as sent, after one attempt."""
    good = sim_factory("--time-scale", "0")
    bad = sim_factory("--time-scale", "0")
    bad.faults(fail_rate=1, fail_status=status)
    kv = kvroute([good, bad], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--breaker-failures", 0])
    n2 = relayed = 0
    for i in range(6):
        stream = i % 2 == 1
        r = post(kv, sim_chat("status %d request %d" % (status, i), stream=stream))
        a = attempts(r)
        if status == 501:
            assert a == 1, r.headers
            if r.headers["x-kvroute-worker"] == bad.url:
                assert r.status_code == 501
                assert assert_openai_error(r)["code"] == "injected_failure"
                relayed += 1
            else:
                assert r.status_code == 200
        else:
            assert r.status_code == 200, (r.status_code, r.text[:200])
            assert r.headers["x-kvroute-worker"] == good.url
            if stream:
                assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
            else:
                assert r.json()["object"] == "chat.completion"
            n2 += a == 2
    m = kv.metrics()
    if status == 501:
        assert relayed >= 1
        assert m.get("kvroute_retries_total") == 0, m.find("kvroute_retries_total")
    else:
        assert n2 >= 1
        assert m.get("kvroute_retries_total", model=SIM_MODEL, reason="http_%d" % status) == n2, \
            m.find("kvroute_retries_total")
        assert worker_attempts(m, bad.url) == n2
    kv.wait_inflight_zero()


@pytest.mark.parametrize("mode", ["close_before_headers", "reset_before_headers"])
def test_cut_before_headers_is_retried(stub, kvroute, mode):
    bad, good = stub(), stub()
    bad.config(mode=mode)  # this worker's default: every proxied request is cut
    kv = kvroute([bad, good], health_interval_ms=200, extra=["--breaker-failures", 0])
    n2 = 0
    for i in range(6):
        r = kv.chat(content="cut %d" % i)
        assert r.status_code == 200, (r.status_code, r.text[:200])
        assert r.headers["x-kvroute-worker"] == good.url
        n2 += attempts(r) == 2
    assert n2 >= 1, n2
    assert len(good.proxied()) == 6
    # Each retried request reached the bad worker. A request may reach it twice only when the
    # first copy went on a reused keep-alive connection (the transport's stale-connection
    # resend: kvroute cannot tell a worker that read the request and closed from one that
    # closed the idle connection as it was reused); kvroute itself never retries there.
    log = bad.proxied()
    assert len({e["body_sha256"] for e in log}) == n2, [e["body_sha256"][:8] for e in log]
    seen = set()
    for e in log:
        if e["body_sha256"] in seen:
            prev = [x for x in log if x["body_sha256"] == e["body_sha256"]][0]
            assert prev["conn_request_index"] > 1, (
                "a request cut on a fresh connection was sent to the same worker again: %r"
                % [(x["conn_id"], x["conn_request_index"]) for x in log])
        seen.add(e["body_sha256"])
    m = kv.metrics()
    assert m.get("kvroute_retries_total", reason="reset") == n2, m.find("kvroute_retries_total")
    kv.wait_inflight_zero()


def _garbage_worker(stop):
    """Answers GETs (health checks) properly and every POST with bytes that are not HTTP."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    posts = []

    def handle(c):
        with c:
            c.settimeout(5)
            buf = b""
            try:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                if buf.startswith(b"POST"):
                    posts.append(time.monotonic())
                    c.sendall(b"HELLO THIS IS NOT HTTP\r\n\r\n")
                    time.sleep(0.05)
                else:
                    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            except OSError:
                pass

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return "http://127.0.0.1:%d" % port, posts


def test_garbage_reply_before_headers_is_retried(stub, kvroute):
    stop = threading.Event()
    try:
        bad_url, posts = _garbage_worker(stop)
        good = stub()
        kv = kvroute([bad_url, good], health_interval_ms=200,
                     extra=["--breaker-failures", 0, "--scrape-interval", 0])
        n2 = 0
        for i in range(6):
            r = kv.chat(content="garbage %d" % i)
            assert r.status_code == 200, (r.status_code, r.text[:200])
            assert r.headers["x-kvroute-worker"] == good.url
            n2 += attempts(r) == 2
        assert n2 >= 1 and len(posts) >= n2, (n2, len(posts))
        m = kv.metrics()
        assert m.get("kvroute_retries_total", reason="protocol") == n2, \
            m.find("kvroute_retries_total")
        kv.wait_inflight_zero()
    finally:
        stop.set()


@pytest.fixture
def blackhole():
    """A listening port whose accept queue is full, so new connects hang (SYNs dropped)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(s)
        time.sleep(0.05)
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            hangs = False
        except (socket.timeout, OSError):
            hangs = True
        finally:
            probe.close()
        if not hangs:
            pytest.skip("cannot make a connect hang on this kernel (accept queue overflow accepted)")
        yield "http://127.0.0.1:%d" % port
    finally:
        for s in fillers:
            s.close()
        lst.close()


def test_connect_timeout_is_retried(stub, kvroute, blackhole):
    good = stub()
    kv = kvroute([blackhole, good], health_interval_ms=0,
                 extra=["--connect-timeout-ms", 300, "--breaker-failures", 0,
                        "--scrape-interval", 0])
    n2 = 0
    for i in range(4):
        t0 = time.monotonic()
        r = kv.chat(content="blackhole %d" % i)
        took = time.monotonic() - t0
        assert r.status_code == 200, (r.status_code, r.text[:200])
        assert r.headers["x-kvroute-worker"] == good.url
        if attempts(r) == 2:
            n2 += 1
            assert took >= 0.25, took
    assert n2 >= 1
    m = kv.metrics()
    assert m.get("kvroute_retries_total", reason="connect_timeout") == n2, \
        m.find("kvroute_retries_total")
    kv.wait_inflight_zero()


# ============================================================================ 8. cut mid-stream
@pytest.mark.parametrize("fault", ["drop", "stall"])
def test_stream_cut_after_first_byte_ends_with_error_and_connection_is_reused(
        sim_factory, kvroute, fault):
    s1 = sim_factory("--time-scale", "0")
    s2 = sim_factory("--time-scale", "0")
    for s in (s1, s2):
        if fault == "drop":
            s.faults(drop_after_events=3)
        else:
            s.faults(stall_after_events=3)
    kv = kvroute([s1, s2], model=SIM_MODEL, health_interval_ms=0,
                 extra=["--stream-idle-timeout-ms", 500])
    body = json.dumps(sim_chat("cut me", stream=True, max_tokens=20)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, P, body))
        head = c.read_head(timeout=10)
        assert head and head[0] == 200, head
        hdrs = dict(head[3])
        assert hdrs.get("x-kvroute-attempts") == "1", hdrs
        datas = []
        try:
            for _, ev, _ in c.iter_sse(head[3], timeout=10):
                datas.append(ev["data"])
        except TimeoutError:
            pytest.fail("the cut stream was left hanging after %r" % datas[-2:])
        assert c.body_complete, "no chunked terminator after the error event: %r" % datas[-2:]
        assert len(datas) == 4, datas  # the 3 events the worker sent, then kvroute's error
        for d in datas[:3]:
            assert json.loads(d)["object"] == "chat.completion.chunk"
        error_event(datas)
        assert not c.eof, "kvroute closed a connection whose stream was ended properly"
        # the same connection serves the next request
        c.send(http_post(kv.port, P, json.dumps(sim_chat("next on the same connection")).encode()))
        r2 = c.read_response(timeout=10)
        assert r2 is not None, "connection closed after the cut stream"
        assert r2.status == 200, r2
        assert r2.json()["object"] == "chat.completion"
    m = kv.metrics()
    assert m.get("kvroute_retries_total") == 0, "retried after a byte reached the client"
    # one attempt for the stream, one for the JSON request
    assert worker_attempts(m, s1.url) + worker_attempts(m, s2.url) == 2, \
        m.find("kvroute_worker_requests_total")
    kv.wait_inflight_zero()


@pytest.mark.parametrize("fault", ["drop", "stall"])
def test_failures_after_the_first_byte_count_for_the_breaker(sim_factory, kvroute, fault):
    """Streams cut (or stalled past --stream-idle-timeout-ms) after their first byte are not
    retried but are failures: three in a row open the breaker and the worker gets no more."""
    good = sim_factory("--time-scale", "0")
    bad = sim_factory("--time-scale", "0")
    bad.faults(**{"drop_after_events" if fault == "drop" else "stall_after_events": 2})
    kv = kvroute([good, bad], model=SIM_MODEL, health_interval_ms=200,
                 extra=["--breaker-failures", 3, "--breaker-cooldown-ms", 60000,
                        "--stream-idle-timeout-ms", 300])
    cut = 0
    for i in range(12):
        rec = raw_exchange(kv.port, sim_chat("stream %d" % i, stream=True, max_tokens=6),
                           timeout=10)
        assert not rec["hung"] and rec["status"] == 200 and rec["complete"], rec
        assert rec["headers"]["x-kvroute-attempts"] == "1", rec["headers"]
        if rec["headers"]["x-kvroute-worker"] == bad.url:
            error_event(rec["datas"])
            cut += 1
        else:
            assert rec["datas"][-1] == "[DONE]", rec["datas"][-2:]
    m = kv.metrics()
    assert cut == 3, "%d streams went to the failing worker (breaker after 3)" % cut
    assert breaker_state(m, bad.url) == 1
    assert transitions(m, bad.url, "open") == 1, transitions(m, bad.url)
    assert m.get("kvroute_retries_total") == 0
    kv.wait_inflight_zero()
