#!/usr/bin/env python3
"""A tiny OpenAI-compatible streaming worker for testing kvroute-bench without kvroute or
kvroute-sim: python3 stdlib only, 127.0.0.1 only.

- POST /v1/chat/completions streams SSE chunks (role, content pieces, a final usage chunk with
  prompt_tokens_details.cached_tokens, then [DONE]); the wire writes are cut at odd offsets so
  events arrive split across reads.
- "Tokens" are 4 bytes of the JSON-serialized messages; a prefix cache of 16-token blocks with
  LRU eviction (--kv-blocks) decides cached_tokens, the way vLLM's automatic prefix caching does.
- GET /v1/models, /health, /metrics (vllm:prefix_cache_{hits,queries}_total).
- --worker-header NAME adds x-kvroute-worker / x-kvroute-decision like kvroute does.
- --fail-every N answers every Nth request with a 503 OpenAI error body.
Prints "listening PORT" on stdout when ready.
"""
import argparse
import collections
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK_TOKENS = 16
BYTES_PER_TOKEN = 4


class Cache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.blocks = collections.OrderedDict()
        self.lock = threading.Lock()
        self.hits = 0
        self.queries = 0

    def lookup_and_insert(self, text):
        data = text.encode()
        ntok = max(1, len(data) // BYTES_PER_TOKEN)
        keys, h = [], b""
        for i in range(ntok // BLOCK_TOKENS):
            chunk = data[i * 64:(i + 1) * 64]
            h = hashlib.blake2b(h + chunk, digest_size=8).digest()
            keys.append(h)
        with self.lock:
            matched = 0
            for k in keys:
                if k in self.blocks:
                    matched += 1
                else:
                    break
            for k in keys:
                self.blocks[k] = True
                self.blocks.move_to_end(k)
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
            cached = matched * BLOCK_TOKENS
            self.hits += cached
            self.queries += ntok
        return ntok, cached


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        srv = self.server
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": srv.model, "object": "model"}]})
        elif self.path in ("/health", "/healthz"):
            self.send_json(200, {"ok": True})
        elif self.path == "/metrics":
            lbl = '{model_name="%s"}' % srv.model
            text = ("vllm:prefix_cache_hits_total%s %d\nvllm:prefix_cache_queries_total%s %d\n"
                    "stub_requests_total %d\nstub_session_header_requests_total %d\n"
                    % (lbl, srv.cache.hits, lbl, srv.cache.queries, srv.count,
                       srv.session_headers)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error",
                                           "param": None, "code": None}})

    def do_POST(self):
        srv = self.server
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self.path != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error",
                                           "param": None, "code": None}})
            return
        with srv.lock:
            srv.count += 1
            count = srv.count
            srv.session_headers += 1 if self.headers.get("x-session-id") else 0
        if srv.fail_every and count % srv.fail_every == 0:
            self.send_json(503, {"error": {"message": "injected failure", "type": "server_error",
                                           "param": None, "code": None}})
            return
        try:
            req = json.loads(raw)
            msgs = req["messages"]
            max_tokens = int(req.get("max_tokens", 16))
        except Exception as e:  # noqa: BLE001 - a test stub answers every bad body the same way
            self.send_json(400, {"error": {"message": str(e), "type": "invalid_request_error",
                                           "param": None, "code": None}})
            return
        prompt, cached = srv.cache.lookup_and_insert(json.dumps(msgs, separators=(",", ":")))
        out = max(1, min(max_tokens, srv.max_out))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        if srv.worker_header:
            self.send_header("x-kvroute-worker", srv.worker_header)
            self.send_header("x-kvroute-decision", "stub")
        self.end_headers()
        base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": srv.model}
        events = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
        for i in range(out):
            events.append(dict(base, choices=[{"index": 0, "delta": {"content": "tok "}}], usage=None))
        events.append(dict(base, choices=[], usage={
            "prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": cached}}))
        stream = "".join("data: %s\n\n" % json.dumps(e) for e in events) + "data: [DONE]\n\n"
        data = stream.encode()
        time.sleep(srv.ttft_s)
        # Odd-sized writes so events straddle reads.
        step, i = 37, 0
        while i < len(data):
            piece = data[i:i + step]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            i += step
            step = 37 if step != 37 else 101
        self.wfile.write(b"0\r\n\r\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="stub-model")
    ap.add_argument("--kv-blocks", type=int, default=100000)
    ap.add_argument("--max-out", type=int, default=8, help="cap on streamed tokens (speed)")
    ap.add_argument("--ttft-ms", type=float, default=1.0)
    ap.add_argument("--worker-header", default="")
    ap.add_argument("--fail-every", type=int, default=0)
    # kvroute-sim's flags, accepted so the stub can stand in for it (block size fixed at 16).
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    srv.model, srv.cache, srv.max_out = a.model, Cache(a.kv_blocks), a.max_out
    srv.ttft_s, srv.worker_header, srv.fail_every = a.ttft_ms / 1000.0, a.worker_header, a.fail_every
    srv.lock, srv.count, srv.session_headers = threading.Lock(), 0, 0
    print("listening %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
