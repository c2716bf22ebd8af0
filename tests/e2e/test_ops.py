"""Operations: /v1/models (flag and discovery), /healthz, /readyz with active health checks,
/metrics names and values, SIGTERM draining."""
import json
import signal
import socket
import time

from conftest import (MODEL, Metrics, RawConn, assert_openai_error, chat_body, completion_body,
                      free_port, http_post, responses_body, wait_until)

P = "/v1/chat/completions"


# ------------------------------------------------------------------------------ models
def test_models_from_flag(stub, kvroute):
    w = stub(model="engine-name")
    kv = kvroute([w], model="served-name", health_interval_ms=0)
    r = kv.get("/v1/models")
    assert r.status_code == 200
    obj = r.json()
    assert obj.get("object") == "list", obj
    assert [m["id"] for m in obj["data"]] == ["served-name"], obj
    assert obj["data"][0].get("object") == "model"
    assert kv.chat(model="served-name").status_code == 200
    assert_openai_error(kv.chat(model="engine-name"), 404)


def test_models_discovered_from_workers(stub, kvroute):
    w = stub(model="discovered-model")
    kv = kvroute([w], model=None, health_interval_ms=0)
    r = kv.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["discovered-model"], r.text
    assert any(e["path"] == "/v1/models" for e in w.requests()), "kvroute never asked the worker"
    r = kv.chat(model="discovered-model")
    assert r.status_code == 200, r.text[:200]
    assert_openai_error(kv.chat(model=MODEL), 404)


def test_models_discovered_when_first_worker_down(stub, kvroute):
    dead = "http://127.0.0.1:%d" % free_port()
    w = stub(model="discovered-model")
    kv = kvroute([dead, w], model=None, health_interval_ms=0)
    r = kv.get("/v1/models")
    assert [m["id"] for m in r.json()["data"]] == ["discovered-model"], r.text


def test_models_listed_even_when_no_worker_eligible(kvroute):
    dead = "http://127.0.0.1:%d" % free_port()
    kv = kvroute([dead], health_interval_ms=100)
    wait_until(lambda: kv.get("/readyz").status_code == 503, 3.0, what="/readyz 503")
    r = kv.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [MODEL]


# ------------------------------------------------------------------------------ health / ready
def test_healthz(one):
    kv, _ = one
    r = kv.get("/healthz")
    assert r.status_code == 200


def test_readyz_follows_worker_health(stub, kvroute):
    w1, w2 = stub(), stub()
    kv = kvroute([w1, w2], health_interval_ms=100)
    assert kv.get("/readyz").status_code == 200
    wait_until(lambda: w1.log()["health_checks"] > 0 and w2.log()["health_checks"] > 0, 3.0,
               what="active health checks (GET /health) on both workers")
    w1.kill()
    time.sleep(0.5)
    assert kv.get("/readyz").status_code == 200, "one worker left: still ready"
    w2.kill()
    wait_until(lambda: kv.get("/readyz").status_code == 503, 3.0, what="/readyz 503 with all workers down")
    assert kv.get("/healthz").status_code == 200, "/healthz must stay 200 while serving"
    r = kv.chat()
    assert_openai_error(r, 503)
    assert r.headers.get("retry-after"), "503 without Retry-After: %r" % dict(r.headers)
    w1.restart()
    w2.restart()
    wait_until(lambda: kv.get("/readyz").status_code == 200, 3.0, what="/readyz 200 when workers are back")
    wait_until(lambda: kv.chat().status_code == 200, 3.0, what="requests served again")


def test_unhealthy_worker_gets_no_requests(stub, kvroute):
    w1, w2 = stub(), stub()
    kv = kvroute([w1, w2], health_interval_ms=100)
    w1.config(health_status=503)

    def only_w2():
        seq = [kv.chat().headers.get("x-kvroute-worker") for _ in range(6)]
        return all(s == w2.url for s in seq)
    wait_until(only_w2, 3.0, interval=0.1, what="requests to avoid the worker whose /health is 503")
    w1.config(health_status=200)

    def both():
        seq = {kv.chat().headers.get("x-kvroute-worker") for _ in range(6)}
        return seq == {w1.url, w2.url}
    wait_until(both, 3.0, interval=0.1, what="the recovered worker to get requests again")


def test_readyz_503_when_only_worker_unhealthy(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=100)
    w.config(health_status=500)
    wait_until(lambda: kv.get("/readyz").status_code == 503, 3.0, what="/readyz 503")
    w.config(health_status=200)
    wait_until(lambda: kv.get("/readyz").status_code == 200, 3.0, what="/readyz 200 again")


# ------------------------------------------------------------------------------ metrics
def test_metrics_names_and_values(stub, kvroute):
    w1, w2 = stub(), stub()
    kv = kvroute([w1, w2], policy="round_robin", health_interval_ms=0)
    for _ in range(4):
        assert kv.post(P, chat_body()).status_code == 200
    for _ in range(2):
        assert kv.post("/v1/completions", completion_body()).status_code == 200
    assert kv.post("/v1/responses", responses_body()).status_code == 200
    assert kv.post(P, chat_body(stream=True)).status_code == 200
    assert kv.post(P, chat_body(model="not-served")).status_code == 404
    assert kv.post(P, content=b"{bad json").status_code == 400

    r = kv.get("/metrics")
    assert r.status_code == 200
    assert r.headers.get("content-type", "").startswith("text/plain"), r.headers
    m = Metrics(r.text)
    assert not m.bad_lines, "unparseable exposition lines: %r" % m.bad_lines[:5]

    for name in ("kvroute_requests_total", "kvroute_request_duration_seconds_count",
                 "kvroute_ttft_seconds_count", "kvroute_worker_inflight",
                 "kvroute_worker_requests_total", "kvroute_decisions_total",
                 "process_resident_memory_bytes", "process_open_fds"):
        assert m.has(name), "metric %s missing; have %r" % (name, m.family_names())
    assert "kvroute_upstream_errors_total" in m.types or m.has("kvroute_upstream_errors_total"), \
        "kvroute_upstream_errors_total not declared"
    assert m.types.get("kvroute_requests_total") == "counter"
    assert m.types.get("kvroute_request_duration_seconds") == "histogram"
    assert m.types.get("kvroute_ttft_seconds") == "histogram"
    assert m.types.get("kvroute_worker_inflight") == "gauge"

    def api(e):
        return any(x in e for x in ("chat", "completions", "responses"))
    assert m.get("kvroute_requests_total", code="200", endpoint=api) == 8, \
        m.find("kvroute_requests_total")
    assert m.get("kvroute_requests_total", code="404", endpoint=api) == 1
    assert m.get("kvroute_requests_total", code="400", endpoint=api) == 1
    assert m.get("kvroute_requests_total", code="200", model=MODEL, endpoint=api) == 8
    chat = m.get("kvroute_requests_total", code="200", endpoint=lambda e: "chat" in e)
    compl = m.get("kvroute_requests_total", code="200",
                  endpoint=lambda e: "completions" in e and "chat" not in e)
    resp = m.get("kvroute_requests_total", code="200", endpoint=lambda e: "responses" in e)
    assert (chat, compl, resp) == (5, 2, 1), m.find("kvroute_requests_total")

    assert m.get("kvroute_decisions_total", model=MODEL, policy="round_robin",
                 decision="round_robin") == 8, m.find("kvroute_decisions_total")
    for w in (w1, w2):
        assert m.get("kvroute_worker_requests_total", worker=w.url, code="200") == 4, \
            m.find("kvroute_worker_requests_total")
        inf = m.find("kvroute_worker_inflight", worker=w.url)
        assert len(inf) == 1 and inf[0][1] == 0, inf
    assert {lb["worker"] for lb, _ in m.find("kvroute_worker_inflight")} == {w1.url, w2.url}

    count = m.get("kvroute_request_duration_seconds_count")
    assert count >= 10, "duration histogram counted %s requests (10 made)" % count
    assert m.get("kvroute_request_duration_seconds_bucket", le="+Inf") == count
    assert m.get("kvroute_request_duration_seconds_sum") > 0
    assert m.get("kvroute_ttft_seconds_count") == 8, m.find("kvroute_ttft_seconds_count")
    for base in ("kvroute_request_duration_seconds", "kvroute_ttft_seconds"):
        series = {}
        for n, lb, v in m.samples:
            if n == base + "_bucket":
                key = tuple(sorted((k, x) for k, x in lb.items() if k != "le"))
                le = float("inf") if lb["le"] == "+Inf" else float(lb["le"])
                series.setdefault(key, []).append((le, v))
        assert series, "no %s buckets" % base
        for key, bs in series.items():
            bs.sort()
            vals = [v for _, v in bs]
            assert vals == sorted(vals), "%s buckets not cumulative: %r" % (base, bs)
            assert bs[-1][0] == float("inf")

    rss = m.get("process_resident_memory_bytes")
    fds = m.get("process_open_fds")
    assert 1e6 < rss < 2e9, rss
    assert 3 <= fds < 1000, fds


def test_ttft_measures_time_to_first_byte(one):
    kv, w = one
    before = kv.metrics()
    r = kv.chat(headers={"x-stub-mode": "delay:300"})
    assert r.status_code == 200
    after = kv.metrics()
    d_sum = after.get("kvroute_ttft_seconds_sum") - before.get("kvroute_ttft_seconds_sum")
    d_cnt = after.get("kvroute_ttft_seconds_count") - before.get("kvroute_ttft_seconds_count")
    assert d_cnt == 1, d_cnt
    assert 0.29 <= d_sum < 2.0, "ttft of a request delayed 300 ms recorded as %.3fs" % d_sum
    d_dur = (after.get("kvroute_request_duration_seconds_sum")
             - before.get("kvroute_request_duration_seconds_sum"))
    assert d_dur >= 0.29


def test_open_fds_do_not_leak(one):
    kv, w = one
    for _ in range(5):
        kv.chat()
    base = kv.metrics().get("process_open_fds")
    for i in range(40):
        kv.chat(stream=(i % 2 == 0))
    for _ in range(10):
        kv.chat(headers={"x-stub-mode": "reset_before_headers"})
    c = [RawConn(kv.port) for _ in range(10)]
    for x in c:
        x.close()

    def settled():
        return kv.metrics().get("process_open_fds") <= base + 4
    wait_until(settled, 3.0, what="open fds to settle (from %d)" % base)


# ------------------------------------------------------------------------------ SIGTERM
def _connect_refused(port):
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", port))
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_sigterm_drains_in_flight_then_exits_0(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-events: 6", "x-stub-interval-ms: 250"]))
        head = c.read_head(timeout=5)
        assert head and head[0] == 200
        t_term = time.monotonic()
        kv.proc.signal(signal.SIGTERM)
        wait_until(lambda: _connect_refused(kv.port), 1.0, interval=0.05,
                   what="new connections to be refused after SIGTERM")
        evs = [ev["data"] for _, ev, _ in c.iter_sse(head[3], timeout=10)]
        t_eof = time.monotonic()
        assert c.body_complete, (
            "in-flight stream cut by SIGTERM after %d events (last %r; connection %s %.2fs after "
            "SIGTERM; exit code %r; worker sent %d events, ended=%s)" % (
                len(evs), evs[-1:], "reset" if c.reset else "closed" if c.eof else "open",
                t_eof - t_term, kv.proc.wait(3.0), w.proxied()[0]["events_sent"],
                w.proxied()[0]["ended"]))
        assert evs[-1] == "[DONE]" and len(evs) == 8, evs
    code = kv.proc.wait(5.0)
    assert code is not None, "kvroute still running 5 s after SIGTERM with nothing in flight"
    assert code == 0, "exit code %r after SIGTERM; stderr:\n%s" % (code, kv.proc.stderr_text(20))
    assert time.monotonic() - t_term < 5.0


def test_sigterm_idle_exits_promptly(one):
    kv, _ = one
    idle = RawConn(kv.port)  # an idle keep-alive connection must not hold the exit
    try:
        idle.send(http_post(kv.port, P, chat_body()))
        assert idle.read_response().status == 200
        t0 = time.monotonic()
        kv.proc.signal(signal.SIGTERM)
        code = kv.proc.wait(3.0)
        assert code == 0, "exit %r (None = still running 3 s after SIGTERM)" % code
        assert time.monotonic() - t0 < 3.0
        assert idle.wait_closed(1.0)
    finally:
        idle.close()


def test_sigterm_drain_timeout_bounds_exit(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--drain-timeout", 1])
    hung = RawConn(kv.port, timeout=10)
    try:
        hung.send(http_post(kv.port, P, chat_body(), ["x-stub-mode: hang"]))
        wait_until(lambda: w.proxied(), 3.0, what="the request to reach the worker")
        t0 = time.monotonic()
        kv.proc.signal(signal.SIGTERM)
        code = kv.proc.wait(5.0)
        took = time.monotonic() - t0
        assert code is not None, "still running 5 s after SIGTERM with --drain-timeout 1"
        assert code == 0, "exit code %r" % code
        assert 0.8 <= took < 3.0, "exited %.2fs after SIGTERM (drain timeout 1 s)" % took
        assert hung.wait_closed(1.0), "the in-flight client was left hanging"
    finally:
        hung.close()
    wait_until(lambda: w.proxied()[0]["client_gone"], 2.0, what="the worker to see the cancel")
