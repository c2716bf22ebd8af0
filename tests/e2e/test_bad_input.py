"""Bad input: invalid JSON and fields, methods, paths, size limits, request framing (the B.1
matrix of shared/reference/c-style-and-http-stack.md, sent as raw bytes), slow clients. Every
case checks the status, whether the connection was closed, the OpenAI error shape when a body
is sent, and that the router still serves a normal request afterwards."""
import json
import select
import socket
import time

import pytest

from conftest import (MODEL, SSL_CTX, Kvroute, RawConn, StubWorker, assert_openai_error, chat_body,
                      http_post, raw_request, sha256)

HDR_CAP = 16384      # --max-header-bytes of the shared router (B.1's "16 KB cap set")
DEADLINE_MS = 1000   # --header-timeout-ms / --body-timeout-ms / --idle-timeout-ms of the shared router


class Shared:
    kv = None
    w = None


@pytest.fixture
def bkv(module_procs):
    """One router (and worker) shared by this module; restarted if a test killed it."""
    if Shared.w is None or not Shared.w.proc.alive():
        Shared.w = StubWorker(module_procs, module_procs.tmpdir)
    if Shared.kv is None or not Shared.kv.proc.alive():
        Shared.kv = Kvroute(module_procs, module_procs.tmpdir, [Shared.w], health_interval_ms=0,
                            extra=["--max-header-bytes", HDR_CAP,
                                   "--header-timeout-ms", DEADLINE_MS,
                                   "--body-timeout-ms", DEADLINE_MS,
                                   "--idle-timeout-ms", DEADLINE_MS])
    yield Shared.kv
    assert Shared.kv.proc.alive(), "kvroute died during the test (exit %r); stderr:\n%s" % (
        Shared.kv.proc.returncode(), Shared.kv.proc.stderr_text(30))
    Shared.kv.wait_inflight_zero()


BODY = json.dumps(chat_body()).encode()
L = len(BODY)
CHUNKED = b"%x\r\n" % L + BODY + b"\r\n0\r\n\r\n"
P = "/v1/chat/completions"


def req(lines, body=BODY, sep="\r\n"):
    head = sep.join(lines) + sep + sep
    return head.encode("latin-1") + body


def std(extra=(), cl=True, first="POST %s HTTP/1.1" % P, host="Host: 127.0.0.1"):
    lines = [first]
    if host:
        lines.append(host)
    lines.append("Content-Type: application/json")
    if cl:
        lines.append("Content-Length: %d" % L)
    lines.extend(extra)
    return lines


# id, request bytes, acceptable statuses, must close (True), must stay open (False), either (None)
MATRIX = [
    ("baseline", req(std()), {200}, False),
    ("cl_and_te_chunked", req(std(["Transfer-Encoding: chunked"]), CHUNKED), {400}, True),
    ("te_chunked_then_cl", req(std(cl=False) + ["Transfer-Encoding: chunked", "Content-Length: %d" % L],
                               CHUNKED), {400}, True),
    ("duplicate_cl_different", req(std(["Content-Length: %d" % (L + 5)])), {400}, True),
    ("duplicate_cl_same", req(std(["Content-Length: %d" % L])), {400}, True),
    ("cl_list", req(std(cl=False) + ["Content-Length: %d, %d" % (L, L)]), {400}, True),
    ("te_gzip_chunked", req(std(cl=False) + ["Transfer-Encoding: gzip, chunked"], CHUNKED), {400, 501}, True),
    ("te_chunked_gzip", req(std(cl=False) + ["Transfer-Encoding: chunked, gzip"], CHUNKED), {400}, True),
    ("te_xchunked", req(std(cl=False) + ["Transfer-Encoding: xchunked"], CHUNKED), {400, 501}, True),
    ("te_on_http10", req(std(cl=False, first="POST %s HTTP/1.0" % P) + ["Transfer-Encoding: chunked"],
                         CHUNKED), {400}, True),
    ("obs_fold", req(std(["X-Folded: first", " continued"])), {400}, True),
    ("space_before_colon", req(std(cl=False) + ["Content-Length : %d" % L]), {400}, True),
    ("nul_in_header_value", req(std(["X-Bad: a\x00b"])), {400}, True),
    ("ctl_in_header_name", req(std(["X-B\x01ad: v"])), {400}, True),
    ("cl_negative", req(std(cl=False) + ["Content-Length: -1"]), {400}, True),
    ("cl_plus_sign", req(std(cl=False) + ["Content-Length: +%d" % L]), {400}, True),
    ("cl_10e12", req(std(cl=False) + ["Content-Length: 1000000000000"], b""), {413}, True),
    ("chunk_size_overflow", req(std(cl=False) + ["Transfer-Encoding: chunked"],
                                b"fffffffffffffffffffff\r\n" + BODY), {400, 413}, True),
    ("chunk_data_without_crlf", req(std(cl=False) + ["Transfer-Encoding: chunked"],
                                    b"%x\r\n" % L + BODY + b"XX0\r\n\r\n"), {400}, True),
    ("header_value_32k", req(std(["X-Big: " + "a" * 32768])), {431}, True),
    ("header_lines_300", req(std(["X-H-%d: v" % i for i in range(300)])), {431}, True),
    ("http11_without_host", req(std(host=None)), {400}, None),
    ("two_host_headers", req(std(["Host: other.example"])), {400}, None),
    ("http10_without_keepalive", req(std(first="POST %s HTTP/1.0" % P)), {200}, True),
    ("http2_request_line", req(std(first="POST %s HTTP/2.0" % P)), {505}, True),
    ("method_p_at_st", req(std(first="P@ST %s HTTP/1.1" % P)), {400, 501}, True),
    # a compressed body kvroute cannot read (RFC 9110 15.5.16): 415, not a JSON error
    ("content_encoding_gzip", req(std(["Content-Encoding: gzip"]), b"\x1f\x8b" + BODY[2:]), {415}, True),
    ("content_encoding_identity", req(std(["Content-Encoding: identity"])), {200}, False),
    # issue's own cases
    ("get_on_chat_completions", req(std(cl=False, first="GET %s HTTP/1.1" % P), b""), {405}, None),
    ("unknown_path", req(std(first="POST /v1/nope HTTP/1.1")), {404}, None),
]


@pytest.mark.parametrize("name,data,statuses,close", MATRIX, ids=[m[0] for m in MATRIX])
def test_b1_matrix(bkv, name, data, statuses, close):
    kv = bkv
    resp, closed = raw_request(kv.port, data, timeout=5.0, close_timeout=0.5)
    assert resp is not None, "%s: no response (%s; expected %s)" % (
        name, "connection closed" if closed else "still open after 5 s", sorted(statuses))
    assert resp.status in statuses, "%s: got %d, expected %s; body %r" % (
        name, resp.status, sorted(statuses), resp.body[:200])
    if close is True:
        assert closed, "%s: %d sent but the connection was kept open" % (name, resp.status)
    elif close is False:
        assert not closed, "%s: connection closed after %d" % (name, resp.status)
    if resp.status >= 400 and resp.body:
        assert_openai_error(resp.body)
    if resp.status == 405:
        allow = resp.header("allow") or ""
        assert "POST" in allow.upper(), "405 without 'Allow: POST': %r" % resp.headers
    kv.assert_serving(what=name)


def test_bare_lf_line_endings(bkv):
    """B.1: 'choose one and test it'. Either accepted (200) or rejected with 400 and close."""
    kv = bkv
    resp, closed = raw_request(kv.port, req(std(), sep="\n"), timeout=3.0, close_timeout=1.0)
    assert resp is not None, "no response to bare-LF request (%s)" % (
        "connection closed" if closed else "still open after 3 s")
    assert resp.status in (200, 400), resp
    if resp.status == 400:
        assert closed, "400 on bare LF but the connection was kept open"
    kv.assert_serving(what="bare LF")


def test_absolute_form_target(bkv):
    """Never build the upstream URL from the raw target (SSRF). 400, or converted explicitly
    to the worker's own path."""
    kv = bkv
    w = Shared.w
    w.reset()
    data = req(std(first="POST http://evil.example:9/v1/chat/completions HTTP/1.1"))
    resp, _ = raw_request(kv.port, data, timeout=5.0)
    assert resp is not None
    assert resp.status in (200, 400), "absolute-form target → %d %r" % (resp.status, resp.body[:200])
    if resp.status == 200:
        e = w.proxied()[-1]
        assert e["target"] == P and e["path"] == P, e["target"]
    kv.assert_serving(what="absolute-form target")


def test_three_pipelined_requests_answered_in_order(bkv):
    kv = bkv
    data = b"".join(req(std(["x-request-id: pipe-%d" % i])) for i in range(3))
    with RawConn(kv.port, timeout=5.0) as c:
        c.send(data)
        ids = []
        for i in range(3):
            r = c.read_response(timeout=5.0)
            assert r is not None, "only %d of 3 pipelined responses" % i
            assert r.status == 200, r
            ids.append(r.header("x-request-id"))
    assert ids == ["pipe-0", "pipe-1", "pipe-2"], ids


def test_pipelined_stream_then_json(bkv):
    kv = bkv
    s = json.dumps(chat_body(stream=True)).encode()
    first = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-request-id: p-s\r\n"
             "x-stub-interval-ms: 50\r\nContent-Length: %d\r\n\r\n" % (P, len(s))).encode() + s
    with RawConn(kv.port, timeout=5.0) as c:
        c.send(first + req(std(["x-request-id: p-j"])))
        a = c.read_response(timeout=5.0)
        b = c.read_response(timeout=5.0)
    assert a.status == 200 and a.complete and a.header("x-request-id") == "p-s", a
    assert b is not None and b.status == 200 and b.header("x-request-id") == "p-j", b


def test_expect_100_continue(bkv):
    kv = bkv
    head = req(std(["Expect: 100-continue"]), body=b"")
    with RawConn(kv.port, timeout=5.0) as c:
        c.send(head)
        try:
            interim = c.read_head(timeout=1.5)
        except TimeoutError:
            interim = None
        assert interim is not None, "no '100 Continue' within 1.5 s (client would stall)"
        assert interim[0] == 100, "expected 100 Continue, got %r" % (interim[:2],)
        c.send(BODY)
        r = c.read_response(timeout=5.0)
    assert r is not None and r.status == 200, r


# ------------------------------------------------------------------------------ JSON and fields
BAD_BODIES = [
    ("malformed_json", P, b'{"model": "%s", "messages": [' % MODEL.encode(), 400),
    ("empty_body", P, b"", 400),
    ("not_an_object", P, b'[{"model": "%s"}]' % MODEL.encode(), 400),
    ("trailing_garbage", P, json.dumps(chat_body()).encode() + b" }x", 400),
    ("invalid_utf8", P, b'{"model":"%s","messages":[{"role":"user","content":"\xff\xfe"}]}' % MODEL.encode(), 400),
    ("deep_nesting", P, b'{"model":"%s","messages":' % MODEL.encode() + b"[" * 100000 + b"]" * 100000 + b"}", 400),
    ("chat_missing_model", P, json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), 400),
    ("chat_model_number", P, json.dumps({"model": 123, "messages": [{"role": "user", "content": "x"}]}).encode(), 400),
    ("chat_model_null", P, json.dumps({"model": None, "messages": [{"role": "user", "content": "x"}]}).encode(), 400),
    ("chat_missing_messages", P, json.dumps({"model": MODEL}).encode(), 400),
    ("chat_messages_string", P, json.dumps({"model": MODEL, "messages": "hello"}).encode(), 400),
    ("chat_messages_object", P, json.dumps({"model": MODEL, "messages": {"role": "user"}}).encode(), 400),
    ("completions_missing_model", "/v1/completions", json.dumps({"prompt": "x"}).encode(), 400),
    ("completions_missing_prompt", "/v1/completions", json.dumps({"model": MODEL}).encode(), 400),
    ("completions_prompt_object", "/v1/completions", json.dumps({"model": MODEL, "prompt": {"a": 1}}).encode(), 400),
    ("completions_prompt_bool", "/v1/completions", json.dumps({"model": MODEL, "prompt": True}).encode(), 400),
    ("responses_missing_model", "/v1/responses", json.dumps({"input": "x"}).encode(), 400),
    ("responses_model_list", "/v1/responses", json.dumps({"model": [MODEL], "input": "x"}).encode(), 400),
    ("chat_unknown_model", P, json.dumps(chat_body(model="not-served")).encode(), 404),
    ("completions_unknown_model", "/v1/completions", json.dumps({"model": "not-served", "prompt": "x"}).encode(), 404),
    ("responses_unknown_model", "/v1/responses", json.dumps({"model": "not-served", "input": "x"}).encode(), 404),
]


@pytest.mark.parametrize("name,path,body,status", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_body(bkv, name, path, body, status):
    kv = bkv
    w = Shared.w
    w.reset()
    r = kv.post(path, content=body, timeout=10.0)
    err = assert_openai_error(r, status)
    assert err["type"] == "invalid_request_error" or status != 400, err
    assert w.proxied() == [], "%s was forwarded to the worker" % name
    kv.assert_serving(what=name)


@pytest.mark.parametrize("body", [b"null", b'"x"', b"1", b" true ", b"[]"])
def test_valid_json_that_is_no_object(bkv, body):
    """Valid JSON of another type is told apart from broken JSON: the same answer as for an
    array ("must be a JSON object", invalid_value), not a syntax error it does not have."""
    kv = bkv
    r = kv.post(P, content=body, timeout=10.0)
    err = assert_openai_error(r, 400)
    assert err["code"] == "invalid_value", err
    assert "must be a JSON object" in err["message"], err
    kv.assert_serving(what=body)


def test_compressed_body_gets_415_with_accept_encoding(bkv):
    kv = bkv
    r = kv.post(P, content=b"\x1f\x8b" + BODY[2:], headers={"content-encoding": "gzip"},
                timeout=10.0)
    err = assert_openai_error(r, 415)
    assert "Content-Encoding" in err["message"], err
    assert r.headers.get("accept-encoding") == "identity", r.headers
    kv.assert_serving(what="gzip body")


def test_bad_requests_counted(bkv):
    kv = bkv
    before = kv.metrics().get("kvroute_requests_total", code="400")
    for _ in range(3):
        kv.post(P, content=b"{nope")
    before404 = kv.metrics().get("kvroute_requests_total", code="404")
    kv.post(P, json_body=chat_body(model="not-served"))
    m = kv.metrics()
    assert m.get("kvroute_requests_total", code="400") - before == 3, m.find("kvroute_requests_total")
    assert m.get("kvroute_requests_total", code="404") - before404 == 1


def test_other_methods_and_paths(bkv):
    kv = bkv
    import httpx
    for method, path, want in (("GET", P, 405), ("PUT", P, 405), ("DELETE", "/v1/completions", 405),
                               ("GET", "/v1/responses", 405), ("POST", "/v1/models", 405),
                               ("GET", "/v1/unknown", 404), ("GET", "/", 404),
                               ("GET", "/v1/chat/completions/extra", 404)):
        r = httpx.request(method, kv.url + path, timeout=5.0, verify=SSL_CTX,
                          content=b"{}" if method in ("POST", "PUT") else None)
        assert r.status_code == want, "%s %s → %d (want %d)" % (method, path, r.status_code, want)
        if r.content:
            assert_openai_error(r)
    kv.assert_serving()


# ------------------------------------------------------------------------------ size limits
def test_body_over_max_body_bytes(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--max-body-bytes", 1024])
    ok = json.dumps(chat_body()).encode()
    ok = ok + b" " * (1024 - len(ok))
    assert len(ok) == 1024
    r = kv.post(P, content=ok)
    assert r.status_code == 200, "a body of exactly --max-body-bytes was refused: %d" % r.status_code
    big = json.dumps(chat_body(content="x" * 2000)).encode()
    resp, closed = raw_request(kv.port, http_post(kv.port, P, big), timeout=5.0)
    assert resp is not None and resp.status == 413, resp
    assert_openai_error(resp.body)
    assert len(w.proxied()) == 1
    kv.assert_serving(what="413")


def test_default_max_body_is_32_mib(bkv):
    kv = bkv
    lines = std(cl=False) + ["Content-Length: %d" % (32 * 1024 * 1024 + 1)]
    t0 = time.monotonic()
    resp, closed = raw_request(kv.port, req(lines, body=b""), timeout=5.0)
    assert resp is not None and resp.status == 413, "CL 32 MiB + 1 → %r" % resp
    assert time.monotonic() - t0 < 2.0, "413 only after %.1fs (should not wait for the body)" % (
        time.monotonic() - t0)
    assert closed, "413 without closing (the unread body would be parsed as a request)"
    # exactly 32 MiB is accepted
    w = Shared.w
    w.reset()
    body = json.dumps(chat_body()).encode()
    body = body + b" " * (32 * 1024 * 1024 - len(body))
    r = kv.post(P, content=body, timeout=30.0)
    assert r.status_code == 200, "a 32 MiB body was refused: %d %r" % (r.status_code, r.text[:200])
    assert w.proxied()[0]["body_sha256"] == sha256(body)


def test_headers_over_max_header_bytes(bkv):
    kv = bkv
    resp, closed = raw_request(kv.port, req(std(["X-Big: " + "b" * (HDR_CAP + 100)])), timeout=5.0)
    assert resp is not None and resp.status == 431, resp
    assert closed
    # just under the cap is fine
    resp, _ = raw_request(kv.port, req(std(["X-Big: " + "b" * (HDR_CAP - 400)])), timeout=5.0)
    assert resp is not None and resp.status == 200, resp
    kv.assert_serving(what="431")


# ------------------------------------------------------------------------------ slow clients
def _closed_or_408(c, timeout):
    """Waits for the server to answer 408 or close. Returns (elapsed s, status or None)."""
    t0 = time.monotonic()
    try:
        r = c.read_response(timeout=timeout)
    except TimeoutError:
        return None, None
    except (ConnectionResetError, OSError):
        return time.monotonic() - t0, None
    return time.monotonic() - t0, (r.status if r else None)


def test_partial_headers_then_silence(bkv):
    kv = bkv
    with RawConn(kv.port, timeout=5.0) as c:
        c.send("POST %s HTTP/1.1\r\nHost: x\r\nContent-Le" % P)
        t0 = time.monotonic()
        el, status = _closed_or_408(c, timeout=DEADLINE_MS / 1000.0 + 2.0)
        assert el is not None, "connection still open %.1fs after partial headers" % (time.monotonic() - t0)
        assert status in (None, 408), status
        assert el >= DEADLINE_MS / 1000.0 - 0.2, "closed too early (%.2fs)" % el
    kv.assert_serving(what="partial headers")


def _trickle(kv, c, payload, interval, limit_s):
    """Sends payload one byte per `interval` s until the server closes/answers. Returns the
    elapsed time and the status (None if it closed without one); fails after limit_s. Meanwhile
    other clients must be served."""
    t0 = time.monotonic()
    served_meanwhile = False
    for i in range(len(payload)):
        el = time.monotonic() - t0
        if el > limit_s:
            raise AssertionError("trickling client still connected after %.1fs" % el)
        r, _, _ = select.select([c.sock], [], [], 0)
        if r:
            el, status = _closed_or_408(c, timeout=1.0)
            return time.monotonic() - t0, status, served_meanwhile
        try:
            c.send(payload[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0, None, served_meanwhile
        if i == 3:
            t1 = time.monotonic()
            kv.assert_serving(what="(during a trickling client)")
            served_meanwhile = time.monotonic() - t1 < 1.0
        time.sleep(interval)
    raise AssertionError("sent the whole trickled payload without being cut off")


def test_headers_trickled_hit_absolute_deadline(bkv):
    kv = bkv
    payload = ("POST %s HTTP/1.1\r\nHost: x\r\n" % P + "X-Slow: " + "s" * 200 + "\r\n").encode()
    with RawConn(kv.port, timeout=5.0) as c:
        el, status, served = _trickle(kv, c, payload, 0.1, limit_s=DEADLINE_MS / 1000.0 + 2.0)
    assert status in (None, 408), status
    assert served, "other clients were not served promptly while one trickled"
    kv.assert_serving(what="trickled headers")


def test_body_trickled_hits_absolute_deadline(bkv):
    kv = bkv
    with RawConn(kv.port, timeout=5.0) as c:
        c.send(req(std(), body=b""))
        el, status, served = _trickle(kv, c, BODY, 0.1, limit_s=DEADLINE_MS / 1000.0 + 2.0)
    assert status in (None, 408), status
    if status == 408:
        pass
    assert served
    kv.assert_serving(what="trickled body")


def test_idle_keep_alive_connection_closed(bkv):
    kv = bkv
    with RawConn(kv.port, timeout=5.0) as c:
        c.send(req(std()))
        r = c.read_response(timeout=5.0)
        assert r.status == 200
        t0 = time.monotonic()
        assert c.wait_closed(DEADLINE_MS / 1000.0 + 2.0), "idle keep-alive connection never closed"
        el = time.monotonic() - t0
        assert el >= DEADLINE_MS / 1000.0 - 0.2, "idle connection closed too early (%.2fs)" % el


def test_many_bad_clients_then_good(bkv):
    """A burst of garbage connections (random bytes, half-open, immediate close)."""
    kv = bkv
    socks = []
    try:
        for i in range(30):
            s = socket.create_connection(("127.0.0.1", kv.port), timeout=2.0)
            if i % 3 == 0:
                s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)))
            elif i % 3 == 1:
                s.sendall(b"GET / HTTP/1.1\r\n")
            else:
                s.close()
                continue
            socks.append(s)
        kv.assert_serving(what="garbage connections")
    finally:
        for s in socks:
            s.close()
    kv.assert_serving(what="garbage connections closed")
