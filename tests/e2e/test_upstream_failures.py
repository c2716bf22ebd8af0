"""Upstream failures: refused, reset or silent before any byte → 502 with an OpenAI error; a
worker that dies or stalls mid-response ends the client's response visibly (SSE: a final
`data: {"error":...}` event and a proper end of the chunked stream; JSON: the connection is
closed, so the body is truncated); timeouts are flags; in-flight returns to 0."""
import json
import socket
import time

import pytest

from conftest import (RawConn, assert_openai_error, chat_body, free_port, http_post,
                      wait_until)

P = "/v1/chat/completions"


def upstream_errors(kv, worker_url, kind=None):
    m = kv.metrics()
    if kind is None:
        return {lb.get("kind"): v for lb, v in m.find("kvroute_upstream_errors_total", worker=worker_url)}
    return m.get("kvroute_upstream_errors_total", worker=worker_url, kind=kind)


def stream_request(kv, headers, timeout=10.0, body=None):
    """Sends a streamed chat request on a raw connection; returns (head status, events with
    arrival times, body_complete, connection closed afterwards, leftover bytes)."""
    body = body or json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=timeout) as c:
        c.send(http_post(kv.port, P, body, headers))
        head = c.read_head(timeout=timeout)
        assert head is not None, "connection closed before a status line"
        evs = []
        try:
            for t, ev, _ in c.iter_sse(head[3], timeout=timeout):
                evs.append((t, ev))
        except TimeoutError:
            raise AssertionError("stream left hanging: no end within %.0fs after %d events (%r)" % (
                timeout, len(evs), [e["data"][:60] for _, e in evs[-3:]]))
        complete = c.body_complete
        return head, evs, complete, c.sse_rest


# ------------------------------------------------------------------------------ before any byte
def test_connection_refused_gives_502(kvroute):
    dead = "http://127.0.0.1:%d" % free_port()
    kv = kvroute([dead], health_interval_ms=0)
    for stream in (False, True):
        r = kv.chat(stream=stream)
        err = assert_openai_error(r, 502)
        assert r.headers.get("content-type", "").startswith("application/json"), r.headers
        assert err["type"], err
    assert upstream_errors(kv, dead, "connect") == 2, upstream_errors(kv, dead)
    kv.wait_inflight_zero()
    assert kv.get("/healthz").status_code == 200


@pytest.mark.parametrize("mode", ["close_before_headers", "reset_before_headers"])
def test_reset_before_headers_gives_502(stub, kvroute, mode):
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    r = kv.chat(headers={"x-stub-mode": mode})
    assert_openai_error(r, 502)
    errs = upstream_errors(kv, w.url)
    assert errs.get("reset") == 1, "expected kind=\"reset\" for %s, got %r" % (mode, errs)
    kv.wait_inflight_zero()
    kv.assert_serving(what=mode)


def test_first_byte_timeout_gives_502(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--first-byte-timeout-ms", 300])
    t0 = time.monotonic()
    r = kv.chat(headers={"x-stub-mode": "hang"}, timeout=10)
    took = time.monotonic() - t0
    assert_openai_error(r, 502)
    assert 0.25 <= took < 3.0, "502 after %.2fs with --first-byte-timeout-ms 300" % took
    assert upstream_errors(kv, w.url, "first_byte_timeout") == 1, upstream_errors(kv, w.url)
    # the router closed the upstream connection (the worker can stop the generation)
    wait_until(lambda: w.proxied()[0]["client_gone"], 2.0, what="the worker to see the cancel")
    # a slower-than-nothing but in-time worker is fine
    r = kv.chat(headers={"x-stub-mode": "delay:100"})
    assert r.status_code == 200
    kv.wait_inflight_zero()


def test_no_total_timeout_on_streams(stub, kvroute):
    """First-byte and idle timeouts of 500 ms do not cut a 2.5 s stream whose gaps are 300 ms."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0,
                 extra=["--first-byte-timeout-ms", 500, "--stream-idle-timeout-ms", 500])
    head, evs, complete, _ = stream_request(kv, ["x-stub-events: 8", "x-stub-interval-ms: 300"])
    assert head[0] == 200
    assert complete, "stream did not end properly"
    assert [e["data"] for _, e in evs][-1] == "[DONE]", evs[-2:]
    assert len(evs) == 10
    assert upstream_errors(kv, w.url) == {}, upstream_errors(kv, w.url)


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


def test_connect_timeout_gives_502(kvroute, blackhole):
    kv = kvroute([blackhole], health_interval_ms=0, extra=["--connect-timeout-ms", 300])
    t0 = time.monotonic()
    r = kv.chat(timeout=10)
    took = time.monotonic() - t0
    assert_openai_error(r, 502)
    assert took < 3.0, "502 after %.2fs with --connect-timeout-ms 300" % took
    assert upstream_errors(kv, blackhole, "connect_timeout") == 1, upstream_errors(kv, blackhole)
    kv.wait_inflight_zero()


# ------------------------------------------------------------------------------ mid-response
def assert_sse_error_end(evs, complete, n_before, rest):
    datas = [e["data"] for _, e in evs]
    assert len(datas) >= n_before, datas
    assert complete, ("the chunked stream was not ended properly (no last chunk) after %r; "
                      "leftover %r" % ([d[:60] for d in datas[-2:]], rest[:80]))
    errs = [i for i, d in enumerate(datas) if d and d.startswith("{") and "error" in json.loads(d)]
    assert errs, "no `data: {\"error\":...}` event at the end of a broken stream: %r" % (
        [d[:80] for d in datas[-3:]])
    obj = json.loads(datas[errs[-1]])
    assert isinstance(obj["error"], dict) and obj["error"].get("message"), obj
    assert errs[-1] == len(datas) - 1, "the error event is not the final event: %r" % datas[errs[-1]:]
    assert "[DONE]" not in datas[:errs[-1]], "[DONE] before the error event"
    return obj


@pytest.mark.parametrize("mode", ["drop_after:3", "reset_after:3"])
def test_worker_dies_mid_stream_sse(stub, kvroute, mode):
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    t0 = time.monotonic()
    head, evs, complete, rest = stream_request(
        kv, ["x-stub-mode: " + mode, "x-stub-events: 10", "x-stub-interval-ms: 50"], timeout=5)
    assert head[0] == 200
    assert_sse_error_end(evs, complete, 3, rest)
    for i in range(3):  # the events the worker did send were relayed first
        assert json.loads(evs[i][1]["data"])["choices"][0]["delta"]["content"] == "tok%d " % i
    assert time.monotonic() - t0 < 3.0
    errs = upstream_errors(kv, w.url)
    assert sum(errs.values()) == 1, errs
    assert "reset" in errs, "worker dying mid-stream counted as %r (expected kind=\"reset\")" % errs
    kv.wait_inflight_zero()
    kv.assert_serving(what=mode)


def test_worker_process_killed_mid_stream(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=5) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-events: 100", "x-stub-interval-ms: 100"]))
        head = c.read_head()
        assert head[0] == 200
        evs = []
        for t, ev, _ in c.iter_sse(head[3], timeout=5):
            evs.append((t, ev))
            if len(evs) == 2:
                w.kill()
        complete = c.body_complete
        rest = c.sse_rest
    assert_sse_error_end(evs, complete, 2, rest)
    kv.wait_inflight_zero()


@pytest.mark.parametrize("mode", ["drop_after:20", "reset_after:20"])
def test_worker_dies_mid_json_body(stub, kvroute, mode):
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    body = json.dumps(chat_body()).encode()
    with RawConn(kv.port, timeout=5) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-mode: json," + mode]))
        try:
            r = c.read_response(timeout=5)
        except TimeoutError:
            pytest.fail("truncated JSON response left hanging (no close within 5 s)")
        assert r is not None, "connection closed before the status line"
        assert r.status == 200, r
        assert not r.complete, "a truncated JSON body was presented as complete: %r" % r
        assert c.eof or c.wait_closed(2.0), "connection not closed after a truncated body"
    assert r.body.startswith(b'{"id": "chatcmpl') and len(r.body) <= 20, r.body
    kv.wait_inflight_zero()
    kv.assert_serving(what=mode)


def test_stream_stall_hits_idle_timeout(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--stream-idle-timeout-ms", 500])
    head, evs, complete, rest = stream_request(
        kv, ["x-stub-mode: stall_after:2", "x-stub-events: 10"], timeout=6)
    t_end = time.monotonic()
    assert head[0] == 200
    obj = assert_sse_error_end(evs, complete, 2, rest)
    stall_start = evs[1][0]
    took = t_end - stall_start
    assert 0.4 <= took < 3.0, "stream ended %.2fs after the last event (idle timeout 500 ms)" % took
    assert upstream_errors(kv, w.url, "stream_idle_timeout") == 1, upstream_errors(kv, w.url)
    wait_until(lambda: w.proxied()[0]["client_gone"], 2.0,
               what="the worker to see the stalled transfer cancelled")
    kv.wait_inflight_zero()
    assert obj


def test_json_stall_hits_idle_timeout(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--stream-idle-timeout-ms", 500])
    body = json.dumps(chat_body()).encode()
    with RawConn(kv.port, timeout=6) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-mode: json,stall_after:20"]))
        try:
            r = c.read_response(timeout=6)
        except TimeoutError:
            pytest.fail("response left hanging 6 s with --stream-idle-timeout-ms 500")
        assert r is not None and r.status == 200, r
        assert not r.complete, "stalled JSON body presented as complete"
    assert upstream_errors(kv, w.url, "stream_idle_timeout") == 1, upstream_errors(kv, w.url)
    kv.wait_inflight_zero()


def test_failures_keep_other_requests_flowing(stub, kvroute):
    """While one request hangs at a worker and another fails, a third is answered at once."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    hung = RawConn(kv.port, timeout=10)
    try:
        hung.send(http_post(kv.port, P, json.dumps(chat_body()).encode(), ["x-stub-mode: hang"]))
        wait_until(lambda: w.proxied(), 3.0, what="the hung request to reach the worker")
        r = kv.chat(headers={"x-stub-mode": "reset_before_headers"})
        assert r.status_code == 502
        t0 = time.monotonic()
        kv.assert_serving()
        assert time.monotonic() - t0 < 1.0
        assert kv.inflight()[w.url] == 1
    finally:
        hung.close()
    kv.wait_inflight_zero()
