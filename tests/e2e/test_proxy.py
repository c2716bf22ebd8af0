"""Proxying: forwarding of bodies and headers, relaying of status/headers/body, SSE streamed
event by event, backpressure toward a slow reader, cancellation when the client leaves, request
ids."""
import json
import time

import pytest

from conftest import (MODEL, RawConn, assert_openai_error, chat_body, completion_body,
                      header_value, header_values, http_post, parse_sse, raw_request,
                      responses_body, sha256, wait_until)

ENDPOINTS = [
    ("/v1/chat/completions", chat_body),
    ("/v1/completions", completion_body),
    ("/v1/responses", responses_body),
]
HOP_BY_HOP = ("connection", "keep-alive", "te", "transfer-encoding", "upgrade",
              "proxy-authorization", "proxy-authenticate", "proxy-connection", "trailer")


# ------------------------------------------------------------------------------ forwarding
@pytest.mark.parametrize("path,mk", ENDPOINTS, ids=["chat", "completions", "responses"])
def test_json_response_relayed_unchanged(one, path, mk):
    kv, w = one
    body = json.dumps(mk()).encode()
    r = kv.post(path, content=body)
    assert r.status_code == 200, r.text[:300]
    assert r.headers.get("content-type", "").startswith("application/json")
    logged = w.proxied()
    assert len(logged) == 1, "worker got %d requests" % len(logged)
    e = logged[0]
    assert e["method"] == "POST" and e["path"] == path
    assert e["body_sha256"] == sha256(body), "request body not forwarded byte-identical"
    assert sha256(r.content) == e["resp_body_sha256"], "response body differs from the worker's"
    assert r.headers.get("x-kvroute-worker") == w.url


@pytest.mark.parametrize("path,mk", ENDPOINTS, ids=["chat", "completions", "responses"])
def test_sse_response_relayed_unchanged(one, path, mk):
    kv, w = one
    body = json.dumps(mk(stream=True)).encode()
    with RawConn(kv.port) as c:
        c.send(http_post(kv.port, path, body))
        r = c.read_response(timeout=10)
    assert r is not None and r.status == 200, r
    assert r.header("content-type", "").startswith("text/event-stream"), r.headers
    assert r.complete, "stream not terminated properly (framing %s)" % r.framing
    e = w.proxied()[0]
    assert e["ended"] == "complete"
    assert sha256(r.body) == e["resp_body_sha256"], "SSE bytes differ from the worker's"
    evs = parse_sse(r.body)
    if path != "/v1/responses":
        assert evs[-1]["data"] == "[DONE]"


def test_request_body_forwarded_byte_identical(one):
    kv, w = one
    # odd spacing, key order, escapes, raw UTF-8, unknown fields, trailing whitespace
    body = ('{ "zzz_unknown" : [1, 2.50, null],\n  "messages":[{"role":"user",'
            '"content":"h\\u00e9llo \u00e9t\u00e9 \U0001F600 \\"q\\" \\n"}] ,"model" : "%s",'
            '"temperature": 0.70 }\n\t ' % MODEL).encode("utf-8")
    r = kv.post("/v1/chat/completions", content=body)
    assert r.status_code == 200, r.text[:300]
    e = w.proxied()[0]
    assert e["body_len"] == len(body)
    assert e["body_sha256"] == sha256(body)
    assert header_value(e, "content-type") == "application/json"
    assert header_value(e, "content-length") == str(len(body)), e["headers"]


def test_large_body_forwarded_without_expect_100(one):
    """B.5 #2: libcurl adds Expect: 100-continue over 1 MiB unless told not to; a worker that
    never answers 100 would stall the request."""
    kv, w = one
    big = "x" * (2 * 1024 * 1024)
    body = json.dumps(chat_body(content=big)).encode()
    t0 = time.monotonic()
    r = kv.post("/v1/chat/completions", content=body, timeout=15)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text[:300]
    e = w.proxied()[0]
    assert e["body_sha256"] == sha256(body)
    expect = header_value(e, "expect")
    assert not expect, "kvroute sent 'Expect: %s' upstream (took %.2fs)" % (expect, took)


def test_request_headers_forwarded_except_hop_by_hop(one):
    kv, w = one
    body = json.dumps(chat_body()).encode()
    req = http_post(kv.port, "/v1/chat/completions", body, [
        "Authorization: Bearer sk-test-123",
        "X-Custom-A: value-a",
        "x-session-id: sess-42",
        "OpenAI-Organization: org-1",
        "Keep-Alive: timeout=99",
        "TE: trailers",
        "Proxy-Authorization: Basic Zm9vOmJhcg==",
        "Connection: keep-alive",
    ])
    with RawConn(kv.port) as c:
        c.send(req)
        r = c.read_response()
    assert r.status == 200, r
    e = w.proxied()[0]
    # client credentials are kvroute's to check and never reach a worker (DESIGN §12)
    assert header_value(e, "authorization") is None
    assert header_value(e, "x-custom-a") == "value-a"
    assert header_value(e, "x-session-id") == "sess-42"
    assert header_value(e, "openai-organization") == "org-1"
    for h in ("keep-alive", "te", "proxy-authorization"):
        assert header_value(e, h) is None, "hop-by-hop %r forwarded upstream: %r" % (h, e["headers"])
    host = header_value(e, "host")
    assert host == "127.0.0.1:%d" % w.port, "upstream Host should name the worker, got %r" % host
    assert len(header_values(e, "content-length")) == 1


def test_connection_nominated_headers_not_forwarded(one):
    """RFC 9110 §7.6.1: a header named in Connection is hop-by-hop."""
    kv, w = one
    body = json.dumps(chat_body()).encode()
    req = http_post(kv.port, "/v1/chat/completions", body,
                    ["Connection: keep-alive, X-Hop-Token", "X-Hop-Token: secret"])
    resp, _ = raw_request(kv.port, req, close_timeout=0.1)
    assert resp is not None and resp.status == 200, resp
    e = w.proxied()[0]
    assert header_value(e, "x-hop-token") is None, \
        "header nominated by Connection was forwarded: %r" % e["headers"]


def test_response_headers_relayed_minus_hop_by_hop(one):
    kv, w = one
    body = json.dumps(chat_body()).encode()
    with RawConn(kv.port) as c:
        c.send(http_post(kv.port, "/v1/chat/completions", body))
        r = c.read_response()
    assert r.status == 200, r
    assert r.header("x-stub-custom") == "relayed-value", "worker header not relayed: %r" % r.headers
    assert r.header("x-stub-worker") == w.name
    assert r.header("content-type") == "application/json"
    assert r.header("keep-alive") is None, "worker's Keep-Alive header relayed: %r" % r.headers
    for k, v in r.headers:
        if k == "connection":
            assert "x-stub-hop" not in v.lower(), "worker's Connection header relayed: %r" % v
    assert len(r.header_all("content-length")) <= 1
    assert not (r.header("content-length") and r.header("transfer-encoding")), r.headers


def test_response_header_nominated_by_worker_connection_dropped(one):
    kv, w = one
    r = kv.chat()
    assert r.status_code == 200
    assert "x-stub-hop" not in r.headers, \
        "header the worker nominated in Connection was relayed: %r" % dict(r.headers)


def test_kvroute_headers_on_proxied_responses(stub, kvroute):
    w1, w2 = stub(), stub()
    kv = kvroute([w1, w2], policy="round_robin", health_interval_ms=0)
    seen = set()
    for mk, path in ((chat_body, "/v1/chat/completions"), (completion_body, "/v1/completions"),
                     (responses_body, "/v1/responses"), (chat_body, "/v1/chat/completions")):
        r = kv.post(path, mk())
        assert r.status_code == 200, r.text[:200]
        assert r.headers.get("x-kvroute-worker") in (w1.url, w2.url), dict(r.headers)
        assert r.headers.get("x-kvroute-decision") == "round_robin", dict(r.headers)
        assert r.headers.get("x-request-id"), "no x-request-id on a proxied response"
        # the header names the worker that really answered
        assert r.headers["x-stub-worker"] == (w1.name if r.headers["x-kvroute-worker"] == w1.url else w2.name)
        seen.add(r.headers["x-kvroute-worker"])
    assert seen == {w1.url, w2.url}


def test_upstream_error_status_relayed_as_is(one):
    kv, w = one
    for status in (429, 500, 503):
        r = kv.chat(headers={"x-stub-mode": "fail:%d" % status})
        assert r.status_code == status, "worker answered %d, client got %d: %r" % (
            status, r.status_code, r.text[:200])
        e = w.proxied()[-1]
        assert sha256(r.content) == e["resp_body_sha256"], "worker's error body not relayed"
        assert r.headers.get("x-kvroute-worker") == w.url
    kv.assert_serving()


# ------------------------------------------------------------------------------ request id
def test_request_id_echoed_and_forwarded(one):
    kv, w = one
    r = kv.chat(headers={"x-request-id": "req-abc-123"})
    assert r.status_code == 200
    assert r.headers.get("x-request-id") == "req-abc-123"
    e = w.proxied()[0]
    assert header_values(e, "x-request-id") == ["req-abc-123"], e["headers"]


def test_request_id_generated_when_absent(one):
    kv, w = one
    ids = []
    for _ in range(3):
        r = kv.chat()
        assert r.status_code == 200
        rid = r.headers.get("x-request-id")
        assert rid, "no generated x-request-id"
        ids.append(rid)
    assert len(set(ids)) == 3, "generated ids not unique: %r" % ids
    up = [header_values(e, "x-request-id") for e in w.proxied()]
    assert up == [[i] for i in ids], "upstream x-request-id differs from the client's: %r vs %r" % (up, ids)


# ------------------------------------------------------------------------------ streaming
def test_sse_events_arrive_as_sent(one):
    """Events 200 ms apart reach the client spread out, each within 100 ms of the worker
    writing it (nothing is buffered whole)."""
    kv, w = one
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        t0 = time.monotonic()
        c.send(http_post(kv.port, "/v1/chat/completions", body,
                         ["x-stub-events: 5", "x-stub-interval-ms: 200"]))
        head = c.read_head(timeout=5)
        assert head is not None and head[0] == 200, head
        t_head = time.monotonic()
        arrivals = [(t, ev) for t, ev, _ in c.iter_sse(head[3], timeout=10)]
        assert c.body_complete, "stream did not end with the last chunk"
    e = w.proxied()[0]
    sent = e["event_times"]
    assert len(arrivals) == len(sent) == 7, (len(arrivals), len(sent))
    assert arrivals[-1][1]["data"] == "[DONE]"
    assert t_head - t0 < 0.5, "headers took %.3fs" % (t_head - t0)
    lags = [round(a - s, 3) for (a, _), s in zip(arrivals, sent)]
    assert max(lags) < 0.1, "events reached the client late (s after the worker wrote them): %r" % lags
    spread = arrivals[-1][0] - arrivals[0][0]
    assert spread > 1.0, "events arrived bunched together (%.3fs spread)" % spread
    gaps = [round(b[0] - a[0], 3) for a, b in zip(arrivals, arrivals[1:])]
    assert min(gaps) > 0.1, "events arrived bunched: gaps %r" % gaps


def test_first_event_not_held_back(one):
    """The first event reaches the client at once even when the next one is far away."""
    kv, w = one
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, "/v1/chat/completions", body,
                         ["x-stub-events: 3", "x-stub-interval-ms: 1500"]))
        head = c.read_head(timeout=5)
        assert head and head[0] == 200, head
        it = c.iter_sse(head[3], timeout=5)
        t_first, ev, _ = next(it)
        e = w.proxied()[0]
        assert t_first - e["event_times"][0] < 0.1, "first event held back %.3fs" % (t_first - e["event_times"][0])
    # the client left mid-stream: upstream cancelled
    wait_until(lambda: w.proxied()[0]["client_gone"], 2.0, what="worker sees the disconnect")


def test_slow_reader_does_not_make_router_buffer(one):
    """A client that stops reading: the router pauses the upstream (the worker's writes block)
    and its memory stays bounded; reading again resumes the stream."""
    kv, w = one
    total = 256 * 1024 * 1024
    rss0 = kv.rss_bytes()
    body = json.dumps(chat_body(stream=True)).encode()
    c = RawConn(kv.port, timeout=10, rcvbuf=64 * 1024)
    try:
        c.send(http_post(kv.port, "/v1/chat/completions", body, ["x-stub-mode: flood:%d" % total]))
        head = c.read_head(timeout=5)
        assert head and head[0] == 200, head
        got = 0
        it = c.iter_body(head[3], timeout=10)
        for _, data in it:
            got += len(data)
            if got >= 64 * 1024:
                break
        # stop reading; the worker must end up blocked, not done
        def blocked():
            es = w.proxied()
            return es and es[0]["blocked_now"] and es[0]["write_blocked_ms"] > 1500
        wait_until(blocked, 8.0, interval=0.1, what="the worker's writes to block")
        e = w.proxied()[0]
        rss = kv.rss_bytes()
        m = kv.metrics()
        prom_rss = m.get("process_resident_memory_bytes")
        assert e["ended"] == "in_progress"
        assert e["bytes_written"] < 64 * 1024 * 1024, \
            "worker wrote %d MB while the client read 64 KB: the router buffers" % (e["bytes_written"] >> 20)
        assert rss - rss0 < 32 * 1024 * 1024, "router RSS grew %d MB (from %d MB)" % (
            (rss - rss0) >> 20, rss0 >> 20)
        assert prom_rss > 0 and abs(prom_rss - rss) < 32 * 1024 * 1024, (prom_rss, rss)
        # reading again resumes the upstream
        before = e["bytes_written"]
        for _, data in it:
            got += len(data)
            if got >= before + 16 * 1024 * 1024:
                break
        wait_until(lambda: w.proxied()[0]["bytes_written"] > before, 3.0,
                   what="the worker to resume writing")
    finally:
        t_close = time.monotonic()
        c.close()
    e = wait_until(lambda: [x for x in w.proxied() if x["client_gone"]], 2.0,
                   what="the worker to see the disconnect")[0]
    assert e["t_client_gone"] - t_close < 0.1 + 0.05
    kv.wait_inflight_zero()


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
def test_client_disconnect_mid_stream_cancels_upstream(one, rst):
    kv, w = one
    body = json.dumps(chat_body(stream=True)).encode()
    c = RawConn(kv.port, timeout=10)
    c.send(http_post(kv.port, "/v1/chat/completions", body,
                     ["x-stub-events: 50", "x-stub-interval-ms: 400"]))
    head = c.read_head(timeout=5)
    assert head and head[0] == 200
    it = c.iter_sse(head[3], timeout=5)
    next(it)
    next(it)
    time.sleep(0.1)
    t0 = time.monotonic()
    c.close(rst=rst)
    e = wait_until(lambda: [x for x in w.proxied() if x["client_gone"]], 2.0,
                   what="the worker to see the upstream connection closed")[0]
    took = e["t_client_gone"] - t0
    assert took < 0.1, "upstream cancelled %.0f ms after the client left (limit 100 ms)" % (took * 1000)
    assert e["events_sent"] < 10
    kv.wait_inflight_zero()
    kv.assert_serving()


def test_client_disconnect_before_first_byte_cancels_upstream(one):
    """While the worker is still in prefill (no byte yet), a client that leaves cancels too."""
    kv, w = one
    body = json.dumps(chat_body(stream=True)).encode()
    c = RawConn(kv.port, timeout=10)
    c.send(http_post(kv.port, "/v1/chat/completions", body, ["x-stub-mode: sse,delay:5000"]))
    wait_until(lambda: w.proxied(), 3.0, what="the request to reach the worker")
    time.sleep(0.1)
    t0 = time.monotonic()
    c.close()
    e = wait_until(lambda: [x for x in w.proxied() if x["client_gone"]], 2.0,
                   what="the worker to see the upstream connection closed")[0]
    took = e["t_client_gone"] - t0
    assert took < 0.1, "upstream cancelled %.0f ms after the client left (limit 100 ms)" % (took * 1000)
    kv.wait_inflight_zero()


def test_http10_client_gets_close_delimited_stream(one):
    """B.5 #10: no chunked encoding toward an HTTP/1.0 client."""
    kv, w = one
    body = json.dumps(chat_body(stream=True)).encode()
    with RawConn(kv.port, timeout=10) as c:
        c.send(http_post(kv.port, "/v1/chat/completions", body, version="HTTP/1.0"))
        r = c.read_response(timeout=10)
        assert r is not None and r.status == 200, r
        assert "chunked" not in (r.header("transfer-encoding") or ""), r.headers
        assert c.eof or c.wait_closed(2.0), "connection not closed after an HTTP/1.0 response"
    assert parse_sse(r.body)[-1]["data"] == "[DONE]", r.body[-200:]
    assert sha256(r.body) == w.proxied()[0]["resp_body_sha256"]


def test_keep_alive_reuses_client_connection(one):
    kv, w = one
    with RawConn(kv.port, timeout=10) as c:
        for stream in (False, True, False):
            c.send(http_post(kv.port, "/v1/chat/completions", chat_body(stream=stream)))
            r = c.read_response(timeout=10)
            assert r is not None and r.status == 200, r
            assert r.complete
    assert len(w.proxied()) == 3


def test_unknown_model_not_forwarded(one):
    """A request naming another model is answered by kvroute (404), never forwarded."""
    kv, w = one
    r = kv.chat(model="some-other-model")
    assert_openai_error(r, 404)
    assert w.proxied() == []
