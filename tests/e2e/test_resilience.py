"""Resilience: a worker that cannot be reached is retried elsewhere and marked down at once
(a dead worker has no in-flight load and would otherwise attract least-loaded decisions);
kvroute's SSE error event never lands inside a half-written event; model lookups."""
import json
import socket
import threading
import time

from conftest import (MODEL, RawConn, assert_openai_error, chat_body, free_port, http_post,
                      wait_until)

P = "/v1/chat/completions"


def connect_errors(kv, url):
    return kv.metrics().get("kvroute_upstream_errors_total", worker=url, kind="connect") or 0


def test_unreachable_worker_is_retried_on_another(stub, kvroute):
    live = stub()
    dead = "http://127.0.0.1:%d" % free_port()
    kv = kvroute([dead, live], health_interval_ms=0)  # no health checks: only the retry helps
    for _ in range(6):
        r = kv.chat()
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-worker"] == live.url
    assert connect_errors(kv, dead) >= 3
    m = kv.metrics()
    assert sum(v for _, v in m.find("kvroute_decisions_total")) == 6  # one label per request
    kv.wait_inflight_zero()


def test_worker_killed_is_marked_down_at_first_failure(stub, kvroute):
    a, b = stub(), stub()
    kv = kvroute([a, b], health_interval_ms=60000)  # the next check is a minute away
    wait_until(lambda: kv.get("/readyz").status_code == 200, 5, what="ready")
    a.kill()
    codes, workers = [], set()
    for _ in range(10):
        r = kv.chat()
        codes.append(r.status_code)
        workers.add(r.headers.get("x-kvroute-worker"))
    assert codes == [200] * 10, codes
    assert workers == {b.url}
    # Only the first request ever tried the dead worker: it was marked down at once.
    assert connect_errors(kv, a.url) == 1
    assert kv.metrics().get("kvroute_worker_healthy", worker=a.url) == 0
    kv.wait_inflight_zero()


def _half_event_worker():
    """A worker that streams one whole SSE event, then half of the next, then dies."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def serve():
        srv.settimeout(10)
        while True:  # answer kvroute's GETs (metrics scrape) with 404 until the POST comes
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.settimeout(5)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += c.recv(65536)
            head, rest = buf.split(b"\r\n\r\n", 1)
            if head.startswith(b"POST"):
                break
            c.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            c.close()
        with c:
            n = int([l.split(b":")[1] for l in head.split(b"\r\n")
                     if l.lower().startswith(b"content-length")][0])
            while len(rest) < n:
                rest += c.recv(65536)
            ev1 = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[]}\n\n'
            half = b'data: {"id":"c1","object":"chat.comp'
            def chunk(b):
                return b"%x\r\n%s\r\n" % (len(b), b)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                      b"transfer-encoding: chunked\r\n\r\n" + chunk(ev1))
            time.sleep(0.1)
            c.sendall(chunk(half))
            time.sleep(0.1)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return "http://127.0.0.1:%d" % port, t


def test_sse_error_event_is_never_inside_a_partial_event(kvroute):
    url, t = _half_event_worker()
    kv = kvroute([url], health_interval_ms=0)
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, P, body))
        head = c.read_head(timeout=5)
        assert head and head[0] == 200
        evs = [ev["data"] for _, ev, _ in c.iter_sse(head[3], timeout=10)]
        assert c.body_complete
    t.join(5)
    # Every event the client got parses as JSON: the whole first one, then kvroute's error.
    parsed = [json.loads(e) for e in evs]
    assert parsed[0]["id"] == "c1", evs
    assert parsed[-1]["error"]["code"] == "upstream_error", evs
    assert len(parsed) == 2, evs
    kv.wait_inflight_zero()


def test_model_retrieve(stub, kvroute):
    kv = kvroute([stub()])
    r = kv.get("/v1/models/" + MODEL)
    assert r.status_code == 200 and r.json()["id"] == MODEL
    assert_openai_error(kv.get("/v1/models/not-served"), 404)


def test_no_model_known_yet_is_503_not_404(kvroute):
    dead = "http://127.0.0.1:%d" % free_port()
    kv = kvroute([dead], model=None, health_interval_ms=200)
    r = kv.chat(model="anything")
    assert_openai_error(r, 503)
    assert r.headers.get("retry-after")


def _one_request_per_connection_worker(stop):
    """Answers one request per connection without `Connection: close`, then resets the
    connection when the next request arrives on it (a worker that dropped an idle keep-alive
    connection just as kvroute reused it)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    body = json.dumps({"id": "x", "object": "chat.completion", "model": MODEL, "choices": []}).encode()

    def handle(c):
        with c:
            c.settimeout(5)
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head, rest = buf.split(b"\r\n\r\n", 1)
            n = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    n = int(v)
            while len(rest) < n:
                rest += c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(body), body))
            c.recv(1)  # the next request's first byte: close with it unread → RST
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return "http://127.0.0.1:%d" % port


def test_reused_connection_reset_by_worker_is_not_a_502(kvroute):
    stop = threading.Event()
    try:
        url = _one_request_per_connection_worker(stop)
        kv = kvroute([url], health_interval_ms=0, extra=["--scrape-interval", "0"])
        codes = [kv.chat().status_code for _ in range(6)]
        assert codes == [200] * 6, codes
        kv.wait_inflight_zero()
    finally:
        stop.set()


def test_max_connections_refuses_extra_and_recovers(stub, kvroute):
    kv = kvroute([stub()], extra=["--max-connections", "4"])
    time.sleep(0.3)  # let the readiness probe's connection close
    conns = []
    try:
        for _ in range(7):
            conns.append(socket.create_connection(("127.0.0.1", kv.port), timeout=2))
            time.sleep(0.05)
        time.sleep(0.3)
        open_ = 0
        for s in conns:
            s.settimeout(0.3)
            try:
                open_ += s.recv(1) != b""  # b"" = closed by kvroute
            except socket.timeout:
                open_ += 1  # still open, idle
            except ConnectionResetError:
                pass
        assert 1 <= open_ <= 4, open_
    finally:
        for s in conns:
            s.close()
    wait_until(lambda: kv.chat().status_code == 200, 5, what="serving again")


def test_total_body_bytes_budget(stub, kvroute):
    w = stub()
    kv = kvroute([w], extra=["--max-total-body-bytes", "1000000"])
    big = json.dumps(chat_body(content="x" * 600000)).encode()
    with RawConn(kv.port, timeout=10) as held:
        # Held by a slow worker: its 600 KB body stays counted while it is handled.
        held.send(http_post(kv.port, P, big, ["x-stub-mode: delay:1500"]))
        time.sleep(0.3)
        r = kv.post(P, content=big)
        assert_openai_error(r, 503)
        assert held.read_response(timeout=5).status == 200
    # Released: the same body fits again.
    assert kv.post(P, content=big).status_code == 200
    kv.wait_inflight_zero()


def test_total_body_bytes_budget_reserved_at_headers(stub, kvroute):
    # Uploads over the budget together: the one that declared its size first keeps its room
    # for the whole body; the next is refused as soon as its headers end, before it sends its
    # body, instead of both failing halfway when their bytes add up.
    w = stub()
    kv = kvroute([w], extra=["--max-total-body-bytes", "1000000"])
    big = json.dumps(chat_body(content="x" * 600000)).encode()
    a_req, b_req = http_post(kv.port, P, big), http_post(kv.port, P, big)
    cut = a_req.index(b"\r\n\r\n") + 4 + 100000  # the headers and 100 KB of the body
    with RawConn(kv.port, timeout=10) as a, RawConn(kv.port, timeout=10) as b:
        a.send(a_req[:cut])
        time.sleep(0.3)
        b.send(b_req[:cut])
        r = b.read_response(timeout=5)
        assert r.status == 503, r
        assert r.json()["error"]["message"].startswith("too many request body bytes"), r.body
        # No handler saw it, so no request counter does: the HTTP layer's own counter does.
        assert kv.metrics().get("kvroute_http_refusals_total", status="503") == 1
        a.send(a_req[cut:])
        assert a.read_response(timeout=5).status == 200
    assert kv.post(P, content=big).status_code == 200
    kv.wait_inflight_zero()


def test_drain_timeout_tells_clients_why(stub, kvroute):
    import signal
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--drain-timeout", 1])
    waiting = RawConn(kv.port, timeout=10)    # no response yet when the drain ends
    streaming = RawConn(kv.port, timeout=10)  # a stream that outlives the drain
    try:
        waiting.send(http_post(kv.port, P, json.dumps(chat_body()).encode(), ["x-stub-mode: hang"]))
        streaming.send(http_post(kv.port, P, json.dumps(chat_body(stream=True)).encode(),
                                 ["x-stub-events: 100", "x-stub-interval-ms: 200"]))
        head = streaming.read_head(timeout=5)
        assert head and head[0] == 200
        wait_until(lambda: len(w.proxied()) == 2, 3.0, what="both requests at the worker")
        kv.proc.signal(signal.SIGTERM)
        r = waiting.read_response(timeout=5)
        assert r.status == 503, r
        assert r.json()["error"]["code"] == "shutting_down", r.body
        evs = [ev["data"] for _, ev, _ in streaming.iter_sse(head[3], timeout=5)]
        assert streaming.body_complete
        last = json.loads(evs[-1])
        assert last["error"]["code"] == "shutting_down", evs[-2:]
        assert kv.proc.wait(5.0) == 0
    finally:
        waiting.close()
        streaming.close()
