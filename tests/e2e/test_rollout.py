"""Rollouts (issue 20): on SIGTERM kvroute turns /readyz to 503 at once, keeps serving for
--shutdown-delay-ms (new connections too, since a Kubernetes Service keeps sending to a
terminating pod for a while), then drains as before: no stream is cut, no request lost."""
import json
import signal
import threading
import time

import httpx

from conftest import SSL_CTX, RawConn, chat_body, http_post, wait_until

P = "/v1/chat/completions"


def _stream(port, body, out, idx, started):
    """One SSE stream on its own connection; stores the list of data fields (or an error)."""
    try:
        with RawConn(port, timeout=20) as c:
            c.send(http_post(port, P, body, ["x-stub-events: 10", "x-stub-interval-ms: 200"]))
            head = c.read_head(timeout=10)
            started.release()
            if not head or head[0] != 200:
                out[idx] = ("status", head and head[0])
                return
            evs = [ev["data"] for _, ev, _ in c.iter_sse(head[3], timeout=20)]
            out[idx] = ("ok" if c.body_complete else "cut", evs)
    except Exception as e:  # noqa: BLE001 - reported by the test
        started.release()
        out[idx] = ("error", repr(e))


def test_sigterm_shutdown_delay_keeps_serving_then_drains(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--shutdown-delay-ms", 1500])
    assert kv.get("/readyz").status_code == 200
    body = json.dumps(chat_body(stream=True)).encode()
    n = 20
    out = [None] * n
    started = threading.Semaphore(0)
    threads = [threading.Thread(target=_stream, args=(kv.port, body, out, i, started))
               for i in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        assert started.acquire(timeout=10), "a stream never got its response head"
    t_term = time.monotonic()
    kv.proc.signal(signal.SIGTERM)
    # /readyz is 503 at once (the first probe after the signal), /healthz stays 200
    r = wait_until(lambda: (lambda r: r if r.status_code == 503 else None)(kv.get("/readyz")),
                   0.3, interval=0.01, what="/readyz 503 right after SIGTERM")
    assert r.json()["status"] == "shutting_down", r.text
    assert kv.get("/healthz").status_code == 200, "liveness must hold during the delay"
    # new connections are still served during the delay (streaming and not)
    served = 0
    while time.monotonic() - t_term < 1.0:
        with httpx.Client(timeout=5.0, verify=SSL_CTX) as c:  # a fresh connection each time
            rr = c.post(kv.url + P, json=chat_body())
        assert rr.status_code == 200, "request on a new connection during the delay: %d %r" % (
            rr.status_code, rr.text[:200])
        served += 1
        time.sleep(0.1)
    assert served >= 5
    for t in threads:
        t.join(timeout=20)
    for i, o in enumerate(out):
        assert o is not None and o[0] == "ok", "stream %d: %r" % (i, o)
        assert o[1][-1] == "[DONE]", "stream %d did not end with [DONE]: %r" % (i, o[1][-3:])
    code = kv.proc.wait(5.0)
    took = time.monotonic() - t_term
    assert code == 0, "exit %r after SIGTERM; stderr:\n%s" % (code, kv.proc.stderr_text(20))
    assert took >= 1.5, "exited %.2fs after SIGTERM, before the 1.5 s shutdown delay" % took


def test_shutdown_delay_then_new_connections_refused(stub, kvroute):
    """After the delay the listener closes (drain as before) while a long stream finishes."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--shutdown-delay-ms", 500])
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-events: 10", "x-stub-interval-ms: 200"]))
        head = c.read_head(timeout=5)
        assert head and head[0] == 200
        t0 = time.monotonic()
        kv.proc.signal(signal.SIGTERM)
        time.sleep(0.2)
        assert kv.get("/readyz").status_code == 503
        assert kv.chat().status_code == 200, "not served during the delay"

        def refused():
            try:
                httpx.get(kv.url + "/healthz", timeout=0.5, verify=SSL_CTX)
                return False
            except httpx.HTTPError:
                return True
        wait_until(refused, 2.0, interval=0.05, what="new connections refused after the delay")
        assert time.monotonic() - t0 >= 0.5, "listener closed before the delay ended"
        evs = [ev["data"] for _, ev, _ in c.iter_sse(head[3], timeout=10)]
        assert c.body_complete and evs[-1] == "[DONE]", evs[-3:]
    assert kv.proc.wait(5.0) == 0


def test_sigint_drains_without_delay(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--shutdown-delay-ms", 5000])
    t0 = time.monotonic()
    kv.proc.signal(signal.SIGINT)
    assert kv.proc.wait(3.0) == 0
    assert time.monotonic() - t0 < 3.0


def test_second_sigterm_during_delay_stops_now(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--shutdown-delay-ms", 10000])
    kv.proc.signal(signal.SIGTERM)
    time.sleep(0.3)
    assert kv.proc.alive(), "exited during the shutdown delay"
    assert kv.get("/readyz").status_code == 503
    kv.proc.signal(signal.SIGTERM)
    assert kv.proc.wait(3.0) == 0
