"""OpenTelemetry traces: with --otlp-endpoint, kvroute continues a client's W3C traceparent (or
starts a trace), records one server span per request and, as its direct children, one client
span per upstream attempt, sends each worker the attempt's own traceparent (tracestate passed
on), and exports the spans as OTLP/HTTP JSON in batches. A collector that is down, failing or
hanging never slows a request: spans are dropped and counted.

Real processes on 127.0.0.1: kvroute, stub workers (which log the headers they received) and
a stub OTLP collector in this process (a threaded HTTP server recording every POST). Flush
intervals are short (50 ms) so every wait is a fraction of a second; all waits are bounded.
"""
import json
import socket
import statistics
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import (KVROUTE_BIN, MODEL, SIM_MODEL, SSL_CTX, RawConn, chat_body, header_value,
                      http_post, wait_until)

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_SPAN)
SERVER, CLIENT = 2, 3  # OTLP SpanKind


class Collector:
    """A stub OTLP/HTTP collector on 127.0.0.1. mode: "ok" (200 {}), "fail" (500) or "hang"
    (reads the request, never answers until stopped)."""

    def __init__(self, mode="ok"):
        self.mode = mode
        self.posts = []  # (path, headers dict (lowercase names), body bytes)
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                # headers and body leave in two writes: no Nagle wait between them
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self):
                n = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(n)
                with outer.lock:
                    outer.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                        body))
                if outer.mode == "hang":
                    outer.release.wait(30)
                    return
                code = 500 if outer.mode == "fail" else 200
                out = b'{"error":"down"}' if code == 500 else b"{}"
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/v1/traces" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def spans(self):
        out = []
        with self.lock:
            posts = list(self.posts)
        for _, _, body in posts:
            doc = json.loads(body)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    out.extend(ss["spans"])
        return out

    def trace(self, trace_id):
        return [s for s in self.spans() if s["traceId"] == trace_id]


@pytest.fixture
def collector():
    made = []

    def make(mode="ok"):
        c = Collector(mode)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        (k, x), = v.items()
        out[a["key"]] = int(x) if k == "intValue" else x
    return out


def otlp_flags(url, flush_ms=50, extra=()):
    return ["--otlp-endpoint", url, "--otlp-flush-ms", str(flush_ms)] + list(extra)


def post_chat(kv, headers=None, **kw):
    h = {"content-type": "application/json"}
    h.update(headers or {})
    return httpx.post(kv.url + "/v1/chat/completions", json=chat_body(**kw), headers=h,
                      timeout=10.0, verify=SSL_CTX)


def last_request(stub):
    reqs = stub.requests("/v1/chat/completions")
    assert reqs, "the worker received no request"
    return reqs[-1]


# ============================================================================ tests
def test_client_trace_continued_with_server_and_attempt_spans(stub, kvroute, collector):
    col = collector()
    w = stub()
    kv = kvroute([w], policy="cache_aware", extra=otlp_flags(col.url))
    r = post_chat(kv, {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"})
    assert r.status_code == 200, r.text
    spans = wait_until(lambda: len(col.trace(CLIENT_TRACE)) >= 2 and col.trace(CLIENT_TRACE), 5,
                       what="two spans in the client's trace")
    assert len(spans) == 2, spans
    server = [s for s in spans if s["kind"] == SERVER]
    client = [s for s in spans if s["kind"] == CLIENT]
    assert len(server) == 1 and len(client) == 1, spans
    server, client = server[0], client[0]
    assert server["parentSpanId"] == CLIENT_SPAN
    assert client["parentSpanId"] == server["spanId"]
    assert server["name"] == "POST /v1/chat/completions"
    assert int(server["startTimeUnixNano"]) <= int(client["startTimeUnixNano"]) <= \
        int(client["endTimeUnixNano"]) <= int(server["endTimeUnixNano"])
    a = attrs(client)
    assert a["kvroute.route"] == MODEL
    assert a["kvroute.policy"] == "cache_aware"
    assert a["kvroute.decision"] == r.headers["x-kvroute-decision"]
    assert a["kvroute.worker"] == w.url == r.headers["x-kvroute-worker"]
    assert a["kvroute.attempt"] == 1
    assert a["kvroute.status"] == 200 and a["http.response.status_code"] == 200
    assert abs(a["kvroute.match_ratio"] - float(r.headers["x-kvroute-match"])) < 0.01
    usage = r.json()["usage"]
    assert a["kvroute.prompt_tokens"] == usage["prompt_tokens"]
    assert a["kvroute.completion_tokens"] == usage["completion_tokens"]
    assert a["kvroute.cached_tokens"] == usage.get("prompt_tokens_details", {}).get(
        "cached_tokens", 0)
    assert a["kvroute.ttft_ms"] >= 0
    s = attrs(server)
    assert s["kvroute.status"] == 200 and s["kvroute.attempts"] == 1
    assert s["kvroute.request_id"] == r.headers["x-request-id"]
    # The worker got the attempt's own traceparent (the engine's spans become its children)
    # and the client's tracestate, not the client's traceparent.
    e = last_request(w)
    assert header_value(e, "traceparent") == "00-%s-%s-01" % (CLIENT_TRACE, client["spanId"])
    assert header_value(e, "tracestate") == "congo=t61rcWkgMzE"
    # OTLP/HTTP JSON: uncompressed, with Content-Length, POSTed to the URL as given.
    path, hdrs, body = col.posts[0]
    assert path == "/v1/traces"
    assert hdrs["content-type"] == "application/json"
    assert int(hdrs["content-length"]) == len(body)
    assert "content-encoding" not in hdrs and "transfer-encoding" not in hdrs
    doc = json.loads(col.posts[0][2])
    res = doc["resourceSpans"][0]["resource"]["attributes"]
    assert {"key": "service.name", "value": {"stringValue": "kvroute"}} in res


def test_one_client_span_per_attempt(stub, kvroute, collector):
    """A worker answering 500 is retried on the other: two attempt spans, both children of
    the server span, each worker seeing its own attempt's span as parent."""
    col = collector()
    bad, good = stub(), stub()
    bad.config(mode="fail:500")
    kv = kvroute([bad, good], policy="round_robin", health_interval_ms=0,
                 extra=otlp_flags(col.url, extra=["--breaker-failures", "0"]))
    tid = None
    for i in range(4):
        tid = "%032x" % (0xabc000 + i)
        r = post_chat(kv, {"traceparent": "00-%s-%s-01" % (tid, CLIENT_SPAN)})
        assert r.status_code == 200, r.text
        if r.headers["x-kvroute-attempts"] == "2":
            break
    else:
        pytest.fail("no request was retried")
    spans = wait_until(lambda: len(col.trace(tid)) >= 3 and col.trace(tid), 5,
                       what="three spans in the retried request's trace")
    server = [s for s in spans if s["kind"] == SERVER][0]
    attempts = sorted((s for s in spans if s["kind"] == CLIENT),
                      key=lambda s: attrs(s)["kvroute.attempt"])
    assert [attrs(s)["kvroute.attempt"] for s in attempts] == [1, 2]
    assert all(s["parentSpanId"] == server["spanId"] for s in attempts)
    assert attempts[0]["spanId"] != attempts[1]["spanId"]
    a1, a2 = attrs(attempts[0]), attrs(attempts[1])
    assert a1["kvroute.worker"] == bad.url and a1["kvroute.status"] == 500
    assert attempts[0]["status"]["code"] == 2  # ERROR
    assert a2["kvroute.worker"] == good.url and a2["kvroute.status"] == 200
    assert "status" not in attempts[1]  # UNSET: it succeeded
    assert attrs(server)["kvroute.attempts"] == 2
    assert header_value(last_request(bad), "traceparent").split("-")[2] == attempts[0]["spanId"]
    assert header_value(last_request(good), "traceparent").split("-")[2] == attempts[1]["spanId"]


def test_trace_started_when_client_sends_none(stub, kvroute, collector):
    col = collector()
    w = stub()
    kv = kvroute([w], extra=otlp_flags(col.url))
    r = post_chat(kv, {"tracestate": "orphan=1"})
    assert r.status_code == 200
    tp = header_value(last_request(w), "traceparent")
    _, tid, sid, flags = tp.split("-")
    assert flags == "01" and tid != "0" * 32
    # A tracestate without a valid traceparent is dropped (W3C Trace Context).
    assert header_value(last_request(w), "tracestate") is None
    spans = wait_until(lambda: len(col.trace(tid)) >= 2 and col.trace(tid), 5, what="spans")
    server = [s for s in spans if s["kind"] == SERVER][0]
    assert "parentSpanId" not in server
    client = [s for s in spans if s["kind"] == CLIENT][0]
    assert client["spanId"] == sid
    # An invalid traceparent starts a new trace too.
    r = post_chat(kv, {"traceparent": "00-%s-%s-01" % ("0" * 32, CLIENT_SPAN)})
    assert r.status_code == 200
    assert header_value(last_request(w), "traceparent").split("-")[1] != "0" * 32


def test_duplicate_traceparent_and_unknown_flags(stub, kvroute, collector):
    """Two traceparent headers make it invalid (a new trace starts, as the W3C test suite
    expects); of the trace-flags only the sampled bit is passed on."""
    col = collector()
    w = stub()
    kv = kvroute([w], extra=otlp_flags(col.url))
    other = "00-%s-%s-01" % ("1" * 32, "2" * 16)
    r = httpx.post(kv.url + "/v1/chat/completions", json=chat_body(), timeout=10.0,
                   verify=SSL_CTX, headers=[("traceparent", TRACEPARENT), ("traceparent", other)])
    assert r.status_code == 200
    tid = header_value(last_request(w), "traceparent").split("-")[1]
    assert tid not in (CLIENT_TRACE, "1" * 32)
    r = post_chat(kv, {"traceparent": TRACEPARENT[:-2] + "09"})
    assert r.status_code == 200
    tp = header_value(last_request(w), "traceparent")
    assert tp.split("-")[1] == CLIENT_TRACE and tp.endswith("-01")


def test_stream_cut_after_headers_is_an_error(stub, kvroute, collector):
    """A worker that drops a stream after its headers: the client got 200 and an SSE error
    event; the attempt span and the server span say ERROR with the cause."""
    col = collector()
    w = stub()
    kv = kvroute([w], extra=otlp_flags(col.url))
    r = post_chat(kv, {"traceparent": TRACEPARENT, "x-stub-mode": "sse,drop_after:2"},
                  stream=True)
    assert r.status_code == 200 and '"error"' in r.text
    spans = wait_until(lambda: len(col.trace(CLIENT_TRACE)) >= 2 and col.trace(CLIENT_TRACE), 5,
                       what="two spans")
    server = [s for s in spans if s["kind"] == SERVER][0]
    client = [s for s in spans if s["kind"] == CLIENT][0]
    assert attrs(client)["kvroute.error"] and client["status"]["code"] == 2
    assert attrs(server)["kvroute.status"] == 200
    assert attrs(server)["kvroute.error"] == attrs(client)["kvroute.error"]
    assert server["status"]["code"] == 2


def test_sampling(stub, kvroute, collector):
    """--otlp-sample-ratio 0 records no new trace, yet workers still get a traceparent (flags
    00); a client's sampled flag is followed."""
    col = collector()
    w = stub()
    kv = kvroute([w], extra=otlp_flags(col.url, extra=["--otlp-sample-ratio", "0"]))
    for _ in range(5):
        assert post_chat(kv).status_code == 200
    tp = header_value(last_request(w), "traceparent")
    assert tp.endswith("-00")
    r = post_chat(kv, {"traceparent": TRACEPARENT})
    assert r.status_code == 200
    wait_until(lambda: len(col.trace(CLIENT_TRACE)) >= 2, 5, what="the sampled client trace")
    time.sleep(0.2)
    assert {s["traceId"] for s in col.spans()} == {CLIENT_TRACE}


def test_tracing_off_passes_traceparent_through(stub, kvroute):
    w = stub()
    kv = kvroute([w])
    assert post_chat(kv, {"traceparent": TRACEPARENT}).status_code == 200
    assert header_value(last_request(w), "traceparent") == TRACEPARENT
    m = kv.metrics()  # the families exist with tracing off, at 0
    assert m.get("kvroute_otlp_dropped_spans_total") == 0
    assert m.get("kvroute_otlp_exported_spans_total") == 0


def p50_ms(kv, n):
    """p50 of `n` chat requests on one keep-alive connection, each sent in a single write
    (so no Nagle/delayed-ACK wait hides or adds milliseconds), against a kvroute-sim."""
    req = http_post(kv.port, "/v1/chat/completions",
                    chat_body(model=SIM_MODEL, max_tokens=4))
    out = []
    with RawConn(kv.port, timeout=10.0) as c:
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t = time.perf_counter()
            c.send(req)
            r = c.read_response(timeout=10.0)
            out.append((time.perf_counter() - t) * 1000)
            assert r is not None and r.status == 200, r
    return statistics.median(out)


@pytest.mark.parametrize("mode", ["hang", "fail"])
def test_broken_collector_costs_no_latency(sim_factory, kvroute, collector, mode):
    """Requests through a kvroute whose collector hangs (or answers 500) are as fast at p50 as
    through one whose collector works; the spans that could not go are counted as dropped."""
    good, bad = collector("ok"), collector(mode)
    w = sim_factory("--time-scale", "0")
    small = ["--otlp-batch-size", "128", "--otlp-max-queue", "256", "--otlp-timeout-ms", "30000"]
    kv_ok = kvroute([w], model=SIM_MODEL, extra=otlp_flags(good.url, 20, small))
    kv_bad = kvroute([w], model=SIM_MODEL, extra=otlp_flags(bad.url, 20, small))
    p50_ms(kv_ok, 50)
    p50_ms(kv_bad, 50)  # warm both (connections, first exports)
    ok, broken = [], []
    for _ in range(5):  # interleaved rounds: a busy moment hits both alike
        ok.append(p50_ms(kv_ok, 100))
        broken.append(p50_ms(kv_bad, 100))
    d = statistics.median(broken) - statistics.median(ok)
    print("p50 ok %.3f ms, %s %.3f ms" % (statistics.median(ok), mode, statistics.median(broken)))
    assert d <= 1.0, "p50 %.3f ms with a %s collector vs %.3f ms: +%.3f ms" % (
        statistics.median(broken), mode, statistics.median(ok), d)
    dropped = wait_until(lambda: kv_bad.metrics().get("kvroute_otlp_dropped_spans_total"), 5,
                         what="dropped spans counted")
    assert dropped >= 1100 - 128 - 256, dropped  # all but one batch in flight and a queue
    assert kv_ok.metrics().get("kvroute_otlp_dropped_spans_total") == 0
    wait_until(lambda: kv_ok.metrics().get("kvroute_otlp_exported_spans_total") >= 1100, 5,
               what="the working collector's spans exported")
    if mode == "hang":  # one batch in flight at a time: the rest waited, then dropped
        assert len(bad.posts) == 1
        assert kv_bad.metrics().get("kvroute_otlp_queue_spans") == 256


def check(argv):
    """Runs `kvroute ... --check` (it exits by itself; bounded); returns (status, output)."""
    p = subprocess.run([str(KVROUTE_BIN).encode()] + [a if isinstance(a, bytes) else a.encode()
                                                      for a in argv] + [b"--check"],
                       capture_output=True,
                       timeout=10, stdin=subprocess.DEVNULL)
    return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")


def test_otlp_endpoint_checked_at_load(tmp_path):
    """A malformed collector URL, or one the egress policy denies, fails --check."""
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("model: m\nworkers: [\"http://127.0.0.1:9\"]\n"
                   "otlp_endpoint: \"http://127.0.0.2:4318/v1/traces\"\n"
                   "egress: {deny: [\"127.0.0.2/32\"]}\n")
    rc, out = check(["--config", str(cfg)])
    assert rc != 0
    assert "--otlp-endpoint http://127.0.0.2:4318/v1/traces is refused by the egress policy" in out
    rc, out = check(["--worker", "http://127.0.0.1:9", "--model", "m", "--otlp-endpoint",
                     "ftp://x"])
    assert rc != 0
    assert "--otlp-endpoint 'ftp://x' is malformed" in out
    rc, out = check(["--worker", "http://127.0.0.1:9", "--model", "m", "--otlp-endpoint",
                     "http://[::1:4318/v1/traces"])
    assert rc != 0 and "is malformed" in out
    rc, out = check(["--worker", "http://127.0.0.1:9", "--model", "m", "--otlp-endpoint",
                     "http://127.0.0.1:4318/v1/traces", "--otlp-service-name", b"sv\xff"])
    assert rc != 0 and "--otlp-service-name is not valid UTF-8" in out
    rc, out = check(["--worker", "http://127.0.0.1:9", "--model", "m", "--otlp-endpoint",
                     "http://127.0.0.1:4318/v1/traces"])
    assert rc == 0, out
    # files kvroute needs at start are tried too: what --check passes, starts
    rc, out = check(["--worker", "http://127.0.0.1:9", "--model", "m", "--access-log",
                     str(tmp_path / "no" / "dir" / "a.log"), "--admin-token-file",
                     str(tmp_path / "missing")])
    assert rc != 0 and "--access-log" in out and "--admin-token-file" in out, out
