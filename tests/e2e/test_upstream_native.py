"""The native upstream client (--upstream-client native, the default for http:// workers), end
to end: workers that close keep-alive connections after every response (re-sent, never a
failure), a worker writing one byte at a time (relayed exactly), a 200 MiB stream with bounded
memory, malformed answers (502, counted as worker failures, no crash). Each kvroute here is
started with --upstream-client native whatever KVROUTE_UPSTREAM_CLIENT says, except where a test
says otherwise."""
import asyncio
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import (MODEL, SIM_MODEL, SSL_CTX, RawConn, assert_openai_error, chat_body,
                      http_post, parse_sse, sha256, wait_until)

P = "/v1/chat/completions"
MiB = 1 << 20
NATIVE = ["--upstream-client", "native"]


def total(m, name):
    return sum(v for _, v in m.find(name))


def all_ended(w):
    """The stub's log once every entry has ended (falsy before)."""
    es = w.proxied()
    return es if es and all(x["ended"] != "in_progress" for x in es) else None


def sim_closes_after_each_response(sim):
    """The sim really closes a keep-alive connection after one response (unannounced)."""
    body = json.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()
    with RawConn(sim.port, timeout=5) as c:
        c.send(http_post(sim.port, P, body))
        r = c.read_response(timeout=5)
        assert r is not None and r.status == 200, r
        assert "close" not in (r.header("connection") or "").lower(), r.headers
        assert c.wait_closed(timeout=2.0), "kvroute-sim kept the connection open"


async def fire(url, n, concurrency, body):
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as c:
        async def one(i):
            r = await c.post(P, content=body, headers={"content-type": "application/json",
                                                         "x-session-id": "s%d" % i})
            return r.status_code
        return await asyncio.gather(*[one(i) for i in range(n)], return_exceptions=True)


def test_worker_closing_after_every_response(sim_factory, kvroute):
    """kvroute-sim --close-after-requests 1: every pooled connection is closed by the worker
    right after its response. 500 sequential and 500 concurrent requests all succeed and no
    worker failure or retry is counted (a request caught by such a close is re-sent on a fresh
    connection, which is not a failure)."""
    sim = sim_factory("--time-scale", "0", "--close-after-requests", "1")
    sim_closes_after_each_response(sim)
    kv = kvroute([sim.url], model=SIM_MODEL, health_interval_ms=0,
                 extra=NATIVE + ["--scrape-interval", 0])
    body = json.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "hello"}],
                       "max_tokens": 2}).encode()
    bad = []
    with httpx.Client(base_url=kv.url, timeout=10.0) as c:
        for i in range(500):
            r = c.post(P, content=body, headers={"content-type": "application/json"})
            if r.status_code != 200:
                bad.append((i, r.status_code, r.text[:200]))
    assert not bad, bad[:5]
    res = asyncio.run(fire(kv.url, 500, 500, body))
    errs = [r for r in res if r != 200]
    assert not errs, errs[:5]
    m = kv.metrics()
    assert total(m, "kvroute_upstream_errors_total") == 0, m.find("kvroute_upstream_errors_total")
    assert total(m, "kvroute_retries_total") == 0, m.find("kvroute_retries_total")
    kv.wait_inflight_zero()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_worker_writing_one_byte_at_a_time(stub, kvroute, stream):
    """Status line, headers, body (and chunk framing) one byte per write: the client gets
    exactly the worker's body bytes."""
    w = stub(mode="bytewise", events=8)
    kv = kvroute([w], health_interval_ms=0, extra=NATIVE)
    body = json.dumps(chat_body(stream=stream)).encode()
    with RawConn(kv.port, timeout=30) as c:
        c.send(http_post(kv.port, P, body))
        r = c.read_response(timeout=30)
    assert r is not None and r.status == 200, r
    assert r.complete, r.framing
    # the stub marks the entry after its last (flushed, paced) byte: the client may be first
    e = wait_until(lambda: all_ended(w), 5.0,
                   what="the stub to finish its log entry")[-1]
    assert e["ended"] == "complete", e["ended"]
    assert sha256(r.body) == e["resp_body_sha256"], "relayed bytes differ from the worker's"
    if stream:
        assert parse_sse(r.body)[-1]["data"] == "[DONE]"
    else:
        assert json.loads(r.body)["object"] == "chat.completion"
    assert r.header("x-stub-custom") == "relayed-value", r.headers


def test_200_mib_stream_memory_bounded(stub, kvroute):
    """A 200 MiB SSE stream passes whole while kvroute's RSS stays within 16 MiB of idle."""
    from conftest import KVROUTE_BIN
    asan = b"__asan_init" in KVROUTE_BIN.read_bytes()
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=NATIVE + ["--scrape-interval", 0])
    r = kv.chat(stream=True)  # warm up: pools, buffers
    assert r.status_code == 200
    time.sleep(0.3)
    idle = kv.rss_bytes()
    want = 200 * MiB
    body = json.dumps(chat_body(stream=True)).encode()
    peak = idle
    got = 0
    last_sample = 0.0
    with RawConn(kv.port, timeout=60) as c:
        c.send(http_post(kv.port, P, body, ["x-stub-mode: flood:%d" % want]))
        head = c.read_head(timeout=10)
        assert head and head[0] == 200, head
        for _, data in c.iter_body(head[3], timeout=60):
            got += len(data)
            now = time.monotonic()
            if now - last_sample > 0.05:
                peak = max(peak, kv.rss_bytes())
                last_sample = now
        complete = c.body_complete
    peak = max(peak, kv.rss_bytes())
    e = wait_until(lambda: all_ended(w), 5.0,
                   what="the stub to finish its log entry")[-1]
    assert complete and e["ended"] == "complete", (complete, e["ended"])
    assert got >= want, got
    if not asan:  # ASan's quarantine and shadow memory make RSS meaningless
        assert peak - idle <= 16 * MiB, "RSS grew %.1f MiB over idle %.1f MiB" % (
            (peak - idle) / MiB, idle / MiB)
    kv.wait_inflight_zero()


@pytest.mark.parametrize("kind", ["status_line", "chunk_size", "overlong", "status_999",
                                  "gzip_chunked"])
def test_malformed_answer_gives_502(stub, kvroute, kind):
    """A bad status line, a bad chunk size, a body longer than its Content-Length: 502 with an
    OpenAI error, counted as a worker failure (kind protocol), and kvroute keeps serving."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=NATIVE + ["--max-retries", 0])
    r = kv.chat(headers={"x-stub-mode": "malformed:%s" % kind})
    err = assert_openai_error(r, 502)
    assert "protocol" in err["message"], err
    m = kv.metrics()
    assert m.get("kvroute_upstream_errors_total", worker=w.url, kind="protocol") == 1, \
        m.find("kvroute_upstream_errors_total")
    kv.wait_inflight_zero()
    kv.assert_serving(w)


@pytest.mark.parametrize("client", ["native", "curl"])
def test_head_larger_than_the_write_buffer(stub, kvroute, client):
    """A worker's 100 KB header block is over kvroute's 64 KiB client write buffer: the body
    still follows once the client read the head (it used to stall until the client gave up)."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--upstream-client", client])
    with RawConn(kv.port, timeout=10.0) as c:  # httpx refuses heads over 64 KiB itself
        c.send(http_post(kv.port, P, chat_body(), headers=["x-stub-mode: malformed:big_head"]))
        r = c.read_response(timeout=10.0)
    assert r is not None and r.status == 200 and r.complete, r
    assert len(r.header("x-big")) == 100000
    assert json.loads(r.body)["object"] == "chat.completion"
    kv.wait_inflight_zero()


def test_concurrency_over_a_worker_connection_cap(sim_factory, kvroute):
    """--max-worker-connections 1 with 32 concurrent clients: every request answered (a kept
    connection is handed to a waiter only once its last write completed)."""
    sim = sim_factory("--time-scale", "0")
    kv = kvroute([sim], model=SIM_MODEL, health_interval_ms=0,
                 extra=NATIVE + ["--max-worker-connections", 1])
    body = chat_body(model=SIM_MODEL, max_tokens=2)

    def one(i):
        with httpx.Client(timeout=30.0, verify=SSL_CTX) as c:
            return [c.post(kv.url + "/v1/chat/completions", json=body).status_code
                    for _ in range(20)]
    with ThreadPoolExecutor(32) as pool:
        codes = [c for cs in pool.map(one, range(32)) for c in cs]
    assert codes == [200] * 640
    assert kv.proc.alive()
    kv.wait_inflight_zero()


def test_late_close_is_not_resent(kvroute):
    """A reused connection the worker closes 500 ms after reading the request (it was working
    on it) is a failure, not a silent re-send: the worker sees the request once. A close at
    once (the keep-alive race) is still re-sent (test_worker_closing_after_every_response)."""
    import socket
    import threading
    seen = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    ok = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n'
          b'\r\n{}')

    def read_request(c, buf):
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return None, buf
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                return None, b""
            rest += d
        return head, rest[n:]

    def serve():
        srv.settimeout(10)
        try:
            c, _ = srv.accept()
        except OSError:
            return
        c.settimeout(10)
        buf = b""
        for i in range(2):
            head, buf = read_request(c, buf)
            if head is None:
                break
            rid = re.search(rb"(?i)x-request-id:\s*(\S+)", head).group(1)
            seen.append(rid)
            if i == 0:
                c.sendall(ok)
            else:
                time.sleep(0.5)
                c.close()
                break
        try:  # a re-send would come on a new connection, at once
            srv.settimeout(1.5)
            c2, _ = srv.accept()
            c2.settimeout(2)
            head, _ = read_request(c2, b"")
            if head is not None:
                seen.append(re.search(rb"(?i)x-request-id:\s*(\S+)", head).group(1))
            c2.close()
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    srv_url = "http://127.0.0.1:%d" % port
    kv = kvroute([srv_url], health_interval_ms=0, check_inflight=False,
                 extra=NATIVE + ["--max-retries", 0, "--scrape-interval", 0])
    assert kv.chat(timeout=10.0).status_code == 200
    r = kv.chat(timeout=10.0)
    assert r.status_code == 502, r.text
    t.join(5)
    srv.close()
    assert len(seen) == 2 and seen[0] != seen[1], seen


def test_curl_client_still_selectable(stub, kvroute):
    """--upstream-client curl serves the same requests (the e2e subset runs under it too)."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--upstream-client", "curl"])
    for stream in (False, True):
        r = kv.chat(stream=stream)
        assert r.status_code == 200, r.text[:200]
    assert len(w.proxied()) == 2
    assert MODEL
