#!/usr/bin/env python3
"""A stub inference worker for kvroute's end-to-end tests (python3 stdlib only).

It is a raw HTTP/1.1 server on asyncio, so the framing it sends (Content-Length, chunked, a
connection closed or reset at a chosen point) is exactly what a test asks for. It answers the
OpenAI endpoints a vLLM worker serves and records every request it received, what it sent back
and whether and when the client (kvroute) went away, so tests can check forwarding, streaming,
backpressure and cancellation from the worker's side.

Endpoints
  POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages (Anthropic)
        JSON (Content-Length) or SSE (chunked, one event per chunk). SSE when the body says
        "stream": true, unless the mode says otherwise.
  POST /v1/messages/count_tokens  {"input_tokens": <request body bytes / 4>}
  GET  /v1/models           {"object":"list","data":[{"id": <--model>, ...}]}
  GET  /health              --health-status (200), changeable at run time
  GET  /lmcache/status      an LMCache status endpoint for kvroute's lmcache_aware: the JSON
                            value set as `lmcache` through /stub/config (a string is sent as
                            is, so a test can send garbage), with `lmcache_status` (200) after
                            `lmcache_delay_ms` (0); 404 until `lmcache` is set; counted as
                            lmcache_polls in /stub/log, whose lmcache_headers are the last
                            poll's headers
  GET  /stub/log            JSON: {"requests": [...], "connections_accepted": N, "health_checks": N}
  POST /stub/reset          clears the log
  POST /stub/config         JSON object: any of mode, events, interval_ms, health_status,
                            models_status, model, lmcache, lmcache_status, lmcache_delay_ms,
                            kv_transfer_params (sets the defaults for later requests)

Prefill/decode: a JSON request whose kv_transfer_params has do_remote_decode true is answered
with kv_transfer_params (an emulated vLLM NixlConnector: remote_engine_id = the stub's name,
remote_block_ids [1, 2, 3], remote_host/port its own), or with what /stub/config's
kv_transfer_params says ("auto" = that, null = none, an object = sent as is).

Per-request control headers (they travel through kvroute, which forwards client headers)
  x-stub-mode: comma-separated directives, e.g. "sse,delay:200" or "json,drop_after:10"
      json | sse            force the response kind
      delay:MS              wait MS before sending the status line
      fail:STATUS           answer STATUS with an OpenAI-style error body
      stall_after:N         send N SSE events (JSON: N body bytes), then send nothing more and
                            keep the connection open until the client goes (cap 300 s)
      drop_after:N          send N SSE events (JSON: N body bytes), then close (FIN)
      reset_after:N         same, then reset the connection (RST)
      hang                  read the request, never answer (until the client goes)
      close_before_headers  read the request, close the connection (FIN) without answering
      reset_before_headers  read the request, reset the connection (RST) without answering
      flood:BYTES           SSE of ~1 KiB events written as fast as the socket accepts, up to
                            BYTES, logging bytes written and time spent blocked on the socket
      bytewise              write the whole response (status line, headers, body, chunk
                            framing) one byte per write, each flushed before the next
      malformed:KIND        answer with a malformed response in one write, then close:
                            status_line (bad status line), chunk_size (a 200 whose chunked body
                            starts with a bad chunk size), overlong (a 200 whose body is longer
                            than its Content-Length), status_999 (a status out of 100-599),
                            gzip_chunked (Transfer-Encoding: gzip, chunked), big_head (a valid
                            200 whose header block is 100 KB)
  x-stub-events: N          content events in an SSE response (default --events, 5)
  x-stub-interval-ms: N     gap between SSE events (default --interval-ms, 0)

An SSE response is the event list [content 1..N, finish, (usage if stream_options.include_usage),
[DONE]] for chat and completions; for /v1/responses it is response.created, N
response.output_text.delta, response.completed; for /v1/messages message_start,
content_block_start, N content_block_delta, content_block_stop, message_delta, message_stop.
stall_after/drop_after count events of that list.

Log entry fields (times are time.monotonic(), CLOCK_MONOTONIC, comparable with the tests' own
time.monotonic()): seq, conn_id, conn_request_index, method, path, target, version, headers
([name, value] as received), body_len, body_json (the parsed body when a JSON object of at most
64 KiB, else null), body_sha256, model, stream, mode, status, t_start (request
fully read), t_headers_sent, t_end, event_times, events_sent, bytes_written (response body bytes
handed to the socket, framing excluded), resp_body_sha256, wire_bytes_written, write_blocked_ms,
blocked_now, client_gone, t_client_gone, ended ("complete", "client_gone", "dropped", "reset",
"closed_before_headers", "reset_before_headers", "stall_cap", "error", "in_progress").
"""
import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time

MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 256 << 20
STALL_CAP_S = 300.0


class ClientGone(Exception):
    pass


class BadRequest(Exception):
    pass


class Stub:
    def __init__(self, args):
        self.model = args.model
        self.name = args.name
        self.mode = args.mode or ""
        self.events = args.events
        self.interval_ms = args.interval_ms
        self.health_status = args.health_status
        self.models_status = args.models_status
        self.log = []
        self.seq = 0
        self.conn_seq = 0
        self.health_checks = 0
        self.lmcache = None
        self.lmcache_status = 200
        self.lmcache_delay_ms = 0
        self.kv_transfer_params = "auto"
        self.lmcache_polls = 0
        self.lmcache_headers = None
        self.server = None

    # ---------------------------------------------------------------- connection handling
    async def handle_conn(self, reader, writer):
        self.conn_seq += 1
        conn = Conn(self, reader, writer, self.conn_seq)
        try:
            await conn.run()
        except Exception as e:  # a stub must never die on a peer's behaviour
            sys.stderr.write("stub: connection %d error: %r\n" % (conn.id, e))
        finally:
            conn.close()


class Conn:
    def __init__(self, stub, reader, writer, cid):
        self.stub = stub
        self.reader = reader
        self.writer = writer
        self.id = cid
        self.buf = bytearray()
        self.eof = False
        self.gone = asyncio.Event()
        self.t_gone = None
        self.entry = None
        self.closed = False
        self.nreq = 0
        self.resp_written = False  # the current response was fully handed to the socket
        try:
            writer.transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except Exception:
            pass
        self.want_close = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.writer.close()
        except Exception:
            pass

    def mark_gone(self):
        if not self.gone.is_set():
            self.t_gone = time.monotonic()
            self.gone.set()
            if (self.entry is not None and not self.entry["client_gone"]
                    and not self.resp_written):
                self.entry["client_gone"] = True
                self.entry["t_client_gone"] = self.t_gone

    # ---------------------------------------------------------------- request reading
    async def fill(self):
        data = await self.reader.read(65536)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def read_request(self):
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                break
            if len(self.buf) > MAX_HEADER_BYTES:
                raise BadRequest("headers too large")
            if not await self.fill():
                if self.buf:
                    raise BadRequest("eof inside headers")
                return None
        head = bytes(self.buf[:i]).decode("latin-1")
        del self.buf[: i + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise BadRequest("bad request line")
        method, target, version = parts
        headers = []
        for ln in lines[1:]:
            if ":" not in ln:
                raise BadRequest("bad header line")
            k, v = ln.split(":", 1)
            headers.append([k, v.strip(" \t")])
        hmap = {}
        for k, v in headers:
            hmap.setdefault(k.lower(), v)
        te = hmap.get("transfer-encoding", "").lower()
        body = bytearray()
        if "chunked" in te:
            while True:
                while b"\r\n" not in self.buf:
                    if not await self.fill():
                        raise BadRequest("eof in chunk size")
                j = self.buf.find(b"\r\n")
                size = int(bytes(self.buf[:j]).split(b";")[0].strip(), 16)
                del self.buf[: j + 2]
                if size == 0:
                    while True:  # trailers until an empty line
                        while b"\r\n" not in self.buf:
                            if not await self.fill():
                                raise BadRequest("eof in trailers")
                        j = self.buf.find(b"\r\n")
                        line = bytes(self.buf[:j])
                        del self.buf[: j + 2]
                        if not line:
                            break
                    break
                while len(self.buf) < size + 2:
                    if not await self.fill():
                        raise BadRequest("eof in chunk")
                body += self.buf[:size]
                del self.buf[: size + 2]
                if len(body) > MAX_BODY_BYTES:
                    raise BadRequest("body too large")
        else:
            n = int(hmap.get("content-length", "0") or "0")
            if n > MAX_BODY_BYTES:
                raise BadRequest("body too large")
            while len(self.buf) < n:
                if not await self.fill():
                    raise BadRequest("eof in body")
            body = self.buf[:n]
            del self.buf[:n]
        path = target.split("?", 1)[0]
        return {
            "method": method,
            "target": target,
            "path": path,
            "version": version,
            "headers": headers,
            "hmap": hmap,
            "body": bytes(body),
        }

    async def watch(self):
        """Reads during a response: EOF or an error means the client went away."""
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    self.eof = True
                    self.mark_gone()
                    return
                self.buf += data
        except (ConnectionError, OSError):
            self.mark_gone()
        except asyncio.CancelledError:
            raise

    # ---------------------------------------------------------------- writing helpers
    async def send(self, data, body_len=0):
        """Writes and waits until the transport buffer is under its high mark (or the client
        went away). Time spent waiting is the time the socket was blocked."""
        if self.gone.is_set() or self.writer.transport.is_closing():
            self.mark_gone()
            raise ClientGone()
        e = self.entry
        if getattr(self, "bytewise", False) and len(data) > 1:
            for i in range(len(data)):
                await self.send(data[i:i + 1], body_len=body_len if i == len(data) - 1 else 0)
                await self.flush()
                await asyncio.sleep(0.0002)
            return
        self.writer.write(data)
        if e is not None:
            e["wire_bytes_written"] += len(data)
            e["bytes_written"] += body_len
        tr = self.writer.transport
        if tr.get_write_buffer_size() <= 64 * 1024:
            return
        t0 = time.monotonic()
        if e is not None:
            e["blocked_now"] = True
            e["_blocked_since"] = t0
        drain = asyncio.ensure_future(self.writer.drain())
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            done, _ = await asyncio.wait([drain, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (drain, gone):
                if not f.done():
                    f.cancel()
            if e is not None:
                e["blocked_now"] = False
                e["write_blocked_ms"] += (time.monotonic() - t0) * 1000.0
        if drain in done and drain.exception() is not None:
            self.mark_gone()
            raise ClientGone()
        if gone in done:
            raise ClientGone()

    async def flush(self):
        try:
            drain = asyncio.ensure_future(self.writer.drain())
            gone = asyncio.ensure_future(self.gone.wait())
            await asyncio.wait([drain, gone], return_when=asyncio.FIRST_COMPLETED)
            for f in (drain, gone):
                if not f.done():
                    f.cancel()
        except Exception:
            pass

    async def sleep(self, seconds):
        if seconds <= 0:
            if self.gone.is_set():
                raise ClientGone()
            return
        try:
            await asyncio.wait_for(self.gone.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        raise ClientGone()

    def reset(self):
        """Closes with RST (SO_LINGER 0)."""
        sock = self.writer.get_extra_info("socket")
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except Exception:
            pass
        self.closed = True
        self.writer.transport.abort()

    async def close_fin(self):
        await self.flush()
        await asyncio.sleep(0.02)
        self.close()

    async def reset_after_flush(self):
        await self.flush()
        await asyncio.sleep(0.05)  # let the peer read what was sent before the RST
        self.reset()

    # ---------------------------------------------------------------- main loop
    async def run(self):
        while True:
            try:
                req = await self.read_request()
            except BadRequest as e:
                body = json.dumps({"error": {"message": "stub: " + str(e), "type": "invalid_request_error",
                                             "param": None, "code": None}}).encode()
                self.writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                await self.flush()
                return
            except (ConnectionError, OSError):
                return
            if req is None:
                return
            self.nreq += 1
            self.want_close = (req["version"] != "HTTP/1.1"
                               or "close" in req["hmap"].get("connection", "").lower())
            keep = await self.dispatch(req)
            if not keep or self.closed:
                return

    async def dispatch(self, req):
        path = req["path"]
        self.bytewise = False
        if path.startswith("/stub/"):
            return await self.admin(req)
        if path == "/health":
            self.stub.health_checks += 1
            st = self.stub.health_status
            body = json.dumps({"status": "ok" if st == 200 else "unhealthy"}).encode()
            return await self.simple(req, st, body)
        if path == "/lmcache/status":
            return await self.lmcache_status(req)
        self.resp_written = False
        e = self.new_entry(req)
        watcher = asyncio.ensure_future(self.watch())
        try:
            keep = await self.serve(req, e)
        except ClientGone:
            keep = False
            if e["ended"] == "in_progress":
                e["ended"] = "client_gone"
        except (ConnectionError, OSError):
            self.mark_gone()
            keep = False
            if e["ended"] == "in_progress":
                e["ended"] = "client_gone"
        except Exception as ex:
            sys.stderr.write("stub: error serving %s: %r\n" % (path, ex))
            e["ended"] = "error"
            keep = False
        finally:
            if e["t_end"] is None:
                e["t_end"] = time.monotonic()
            self.entry = None
            if not watcher.done():
                watcher.cancel()
                try:
                    await watcher
                except (asyncio.CancelledError, Exception):
                    pass
        return keep and not self.eof and not self.want_close

    def new_entry(self, req):
        st = self.stub
        st.seq += 1
        body = req["body"]
        model = None
        stream = False
        try:
            obj = json.loads(body) if body else None
            if isinstance(obj, dict):
                model = obj.get("model")
                stream = obj.get("stream") is True
        except Exception:
            obj = None
        e = {
            "seq": st.seq,
            "conn_id": self.id,
            "conn_request_index": self.nreq,
            "method": req["method"],
            "path": req["path"],
            "target": req["target"],
            "version": req["version"],
            "headers": req["headers"],
            "body_len": len(body),
            "body_json": obj if isinstance(obj, dict) and len(body) <= 65536 else None,
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "model": model if isinstance(model, str) else None,
            "stream": stream,
            "mode": req["hmap"].get("x-stub-mode", st.mode),
            "status": None,
            "t_start": time.monotonic(),
            "t_headers_sent": None,
            "t_end": None,
            "event_times": [],
            "events_sent": 0,
            "bytes_written": 0,
            "resp_body_sha256": None,
            "wire_bytes_written": 0,
            "write_blocked_ms": 0.0,
            "blocked_now": False,
            "client_gone": False,
            "t_client_gone": None,
            "ended": "in_progress",
        }
        e["_obj"] = obj
        st.log.append(e)
        self.entry = e
        if self.gone.is_set():
            e["client_gone"] = True
            e["t_client_gone"] = self.t_gone
        return e

    async def simple(self, req, status, body, ctype="application/json", extra=b""):
        keep = req["version"] == "HTTP/1.1" and req["hmap"].get("connection", "").lower() != "close"
        head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                % (status, reason(status), ctype.encode(), len(body)))
        head += extra
        if not keep:
            head += b"Connection: close\r\n"
        self.writer.write(head + b"\r\n" + body)
        await self.flush()
        return keep

    async def lmcache_status(self, req):
        st = self.stub
        st.lmcache_polls += 1
        st.lmcache_headers = req["headers"]
        if st.lmcache_delay_ms:
            await asyncio.sleep(st.lmcache_delay_ms / 1000.0)
        if st.lmcache is None:
            return await self.simple(req, 404, b'{"error":"no lmcache answer set"}')
        v = st.lmcache
        body = v.encode() if isinstance(v, str) else json.dumps(v).encode()
        return await self.simple(req, st.lmcache_status, body)

    async def admin(self, req):
        st = self.stub
        p = req["path"]
        if p == "/stub/log" and req["method"] == "GET":
            now = time.monotonic()
            reqs = []
            for e in st.log:
                d = {k: v for k, v in e.items() if not k.startswith("_")}
                if e["blocked_now"]:  # include the block in progress
                    d["write_blocked_ms"] += (now - e["_blocked_since"]) * 1000.0
                reqs.append(d)
            body = json.dumps({"requests": reqs, "connections_accepted": st.conn_seq,
                               "health_checks": st.health_checks, "name": st.name,
                               "lmcache_polls": st.lmcache_polls,
                               "lmcache_headers": st.lmcache_headers,
                               "pid": os.getpid()}).encode()
            return await self.simple(req, 200, body)
        if p == "/stub/reset" and req["method"] == "POST":
            st.log.clear()
            st.health_checks = 0
            st.lmcache_polls = 0
            return await self.simple(req, 200, b'{"ok":true}')
        if p == "/stub/config" and req["method"] == "POST":
            try:
                cfg = json.loads(req["body"] or b"{}")
                for k in ("mode", "events", "interval_ms", "health_status", "models_status", "model",
                          "lmcache", "lmcache_status", "lmcache_delay_ms", "kv_transfer_params"):
                    if k in cfg:
                        setattr(st, k, cfg[k])
            except Exception as ex:
                return await self.simple(req, 400, json.dumps({"error": str(ex)}).encode())
            return await self.simple(req, 200, b'{"ok":true}')
        return await self.simple(req, 404, b'{"error":"unknown stub admin path"}')

    # ---------------------------------------------------------------- OpenAI endpoints
    async def serve(self, req, e):
        st = self.stub
        path, method = req["path"], req["method"]
        hmap = req["hmap"]
        obj = e.pop("_obj", None)
        directives = parse_mode(e["mode"])
        if "close_before_headers" in directives:
            e["ended"] = "closed_before_headers"
            await asyncio.sleep(0.01)
            self.close()
            return False
        if "reset_before_headers" in directives:
            e["ended"] = "reset_before_headers"
            await asyncio.sleep(0.01)
            self.reset()
            return False
        if "hang" in directives:
            await self.sleep(STALL_CAP_S)
            e["ended"] = "stall_cap"
            self.close()
            return False
        if "delay" in directives:
            await self.sleep(int(directives["delay"]) / 1000.0)

        if path == "/v1/models":
            if method != "GET":
                return await self.respond_error(req, e, 405, "method not allowed")
            if st.models_status != 200:
                return await self.respond_error(req, e, st.models_status, "models unavailable")
            body = json.dumps({"object": "list", "data": [
                {"id": st.model, "object": "model", "created": 1700000000, "owned_by": "kvroute-stub",
                 "root": st.model, "parent": None, "max_model_len": 8192}]}).encode()
            return await self.respond_json(req, e, 200, body)
        kinds = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
                 "/v1/responses": "responses", "/v1/messages": "messages",
                 "/v1/messages/count_tokens": "count_tokens"}
        if path not in kinds:
            return await self.respond_error(req, e, 404, "stub: no such path " + path)
        if method != "POST":
            return await self.respond_error(req, e, 405, "method not allowed")
        if "fail" in directives:
            return await self.respond_error(req, e, int(directives["fail"]), "stub failure (requested)")
        if "malformed" in directives:
            return await self.respond_malformed(e, directives["malformed"])
        self.bytewise = "bytewise" in directives
        kind = kinds[path]
        if not isinstance(obj, dict):
            return await self.respond_error(req, e, 400, "stub: body is not a JSON object")
        model = obj.get("model") if isinstance(obj.get("model"), str) else st.model
        if "flood" in directives:
            return await self.respond_flood(req, e, kind, model, int(directives["flood"]))
        sse = e["stream"]
        if "sse" in directives:
            sse = True
        if "json" in directives:
            sse = False
        nevents = int(hmap.get("x-stub-events", st.events))
        interval = int(hmap.get("x-stub-interval-ms", st.interval_ms)) / 1000.0
        usage_req = bool(isinstance(obj.get("stream_options"), dict)
                         and obj["stream_options"].get("include_usage"))
        prompt_tokens = max(1, len(req["body"]) // 4)
        if kind == "count_tokens":
            body = json.dumps({"input_tokens": prompt_tokens}).encode()
            return await self.respond_json(req, e, 200, body, directives)
        if sse:
            events = sse_events(kind, e["seq"], model, nevents, prompt_tokens, usage_req, st.name)
            return await self.respond_sse(req, e, events, interval, directives)
        body = json_body(kind, e["seq"], model, nevents, prompt_tokens, st.name,
                         self.kv_transfer_answer(obj))
        return await self.respond_json(req, e, 200, body, directives)

    def kv_transfer_answer(self, obj):
        """An emulated vLLM NixlConnector: a request asking for a remote decode is answered
        with the parameters a decode worker needs to fetch its blocks (or, per /stub/config
        kv_transfer_params, none (null) or a given object)."""
        kv = obj.get("kv_transfer_params")
        if not (isinstance(kv, dict) and kv.get("do_remote_decode") is True):
            return None
        cfg = self.stub.kv_transfer_params
        if cfg != "auto":
            return cfg
        port = self.stub.server.sockets[0].getsockname()[1]
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.stub.name, "remote_block_ids": [1, 2, 3],
                "remote_host": "127.0.0.1", "remote_port": port, "tp_size": 1}

    def common_headers(self, req, status):
        # Keep-Alive and a Connection-nominated header are hop-by-hop: kvroute must drop them.
        return (b"HTTP/1.1 %d %s\r\n" % (status, reason(status))
                + b"x-stub-worker: " + self.stub.name.encode() + b"\r\n"
                + b"x-stub-seq: %d\r\n" % self.entry["seq"]
                + b"x-stub-custom: relayed-value\r\n"
                + b"Keep-Alive: timeout=30, max=1000\r\n"
                + (b"Connection: close, x-stub-hop\r\n" if self.want_close
                   else b"Connection: keep-alive, x-stub-hop\r\n")
                + b"x-stub-hop: must-not-be-relayed\r\n")

    async def respond_error(self, req, e, status, message):
        body = json.dumps({"error": {"message": message, "type": "stub_error", "param": None,
                                     "code": status}}).encode()
        return await self.respond_json(req, e, status, body)

    async def respond_json(self, req, e, status, body, directives=None):
        directives = directives or {}
        head = self.common_headers(req, status)
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        e["status"] = status
        cut = None
        how = None
        for k in ("stall_after", "drop_after", "reset_after"):
            if k in directives:
                cut = min(int(directives[k]), len(body))
                how = k
        sent = body if cut is None else body[:cut]
        e["t_headers_sent"] = time.monotonic()
        await self.send(head + sent, body_len=len(sent))  # one write: no Nagle/delayed-ACK stall
        if how is None:
            self.resp_written = True
        e["resp_body_sha256"] = hashlib.sha256(sent).hexdigest()
        return await self.finish_cut(e, how)

    async def finish_cut(self, e, how):
        if how is None:
            await self.flush()
            e["t_end"] = time.monotonic()
            e["ended"] = "complete"
            return True
        if how == "stall_after":
            await self.flush()
            await self.sleep(STALL_CAP_S)
            e["ended"] = "stall_cap"
            self.close()
            return False
        if how == "drop_after":
            e["ended"] = "dropped"
            await self.close_fin()
            e["t_end"] = time.monotonic()
            return False
        e["ended"] = "reset"
        await self.reset_after_flush()
        e["t_end"] = time.monotonic()
        return False

    async def respond_sse(self, req, e, events, interval, directives):
        head = self.common_headers(req, 200)
        head += (b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
        e["status"] = 200
        how, cut = None, None
        for k in ("stall_after", "drop_after", "reset_after"):
            if k in directives:
                how, cut = k, int(directives[k])
        sha = hashlib.sha256()
        e["t_headers_sent"] = time.monotonic()
        await self.send(head)
        for i, ev in enumerate(events):
            if cut is not None and i >= cut:
                e["resp_body_sha256"] = sha.hexdigest()
                return await self.finish_cut(e, how)
            if i > 0:
                await self.sleep(interval)
            sha.update(ev)
            await self.send(b"%x\r\n" % len(ev) + ev + b"\r\n", body_len=len(ev))
            e["events_sent"] += 1
            if len(e["event_times"]) < 2000:
                e["event_times"].append(time.monotonic())
        e["resp_body_sha256"] = sha.hexdigest()
        if cut is not None:  # cut beyond the last event: cut before the terminating chunk
            return await self.finish_cut(e, how)
        await self.send(b"0\r\n\r\n")
        self.resp_written = True
        await self.flush()
        e["t_end"] = time.monotonic()
        e["ended"] = "complete"
        return True

    async def respond_malformed(self, e, kind):
        body = b'{"id":"x","object":"chat.completion","choices":[]}'
        msgs = {
            "status_line": b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\nok",
            "chunk_size": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n"),
            "overlong": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body + b"TRAILING-GARBAGE"),
            "status_999": b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok",
            "gzip_chunked": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n" % len(body)
                             + body + b"\r\n0\r\n\r\n"),
            # a 100 KB header block (over kvroute's 64 KiB write buffer), then a valid body
            "big_head": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"X-Big: " + b"b" * 100000 + b"\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body),
        }
        e["status"] = 0
        e["t_headers_sent"] = time.monotonic()
        await self.send(msgs.get(kind, b"garbage\r\n\r\n"))
        e["ended"] = "dropped"
        await self.close_fin()
        e["t_end"] = time.monotonic()
        return False

    async def respond_flood(self, req, e, kind, model, total):
        head = self.common_headers(req, 200)
        head += (b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
        e["status"] = 200
        e["t_headers_sent"] = time.monotonic()
        await self.send(head)
        template = sse_chunk(kind, e["seq"], model, "x" * 900 + "@@@@@@@@", self.stub.name)
        sent = 0
        i = 0
        sha = hashlib.sha256()
        while sent < total:
            ev = template.replace(b"@@@@@@@@", b"%08d" % i)
            await self.send(b"%x\r\n" % len(ev) + ev + b"\r\n", body_len=len(ev))
            sha.update(ev)
            sent += len(ev)
            e["events_sent"] += 1
            i += 1
        done = b"data: [DONE]\n\n"
        sha.update(done)
        await self.send(b"%x\r\n" % len(done) + done + b"\r\n0\r\n\r\n", body_len=len(done))
        self.resp_written = True
        await self.flush()
        e["resp_body_sha256"] = sha.hexdigest()
        e["t_end"] = time.monotonic()
        e["ended"] = "complete"
        return True


# -------------------------------------------------------------------- payloads
def parse_mode(s):
    out = {}
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            k, v = part.split(":", 1)
            out[k.strip()] = v.strip()
        else:
            out[part] = True
    return out


def reason(status):
    return {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found",
            405: b"Method Not Allowed", 429: b"Too Many Requests",
            500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable"
            }.get(status, b"Status")


def sse_chunk(kind, seq, model, text, name):
    if kind == "chat":
        obj = {"id": "chatcmpl-stub-%d" % seq, "object": "chat.completion.chunk",
               "created": 1700000000, "model": model, "system_fingerprint": name,
               "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None,
                            "finish_reason": None}]}
    elif kind == "completions":
        obj = {"id": "cmpl-stub-%d" % seq, "object": "text_completion", "created": 1700000000,
               "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": None}]}
    elif kind == "messages":
        return msg_event("content_block_delta", index=0,
                         delta={"type": "text_delta", "text": text})
    else:
        return ("event: response.output_text.delta\ndata: "
                + json.dumps({"type": "response.output_text.delta", "item_id": "msg_stub",
                              "output_index": 0, "content_index": 0, "delta": text})
                + "\n\n").encode()
    return ("data: " + json.dumps(obj) + "\n\n").encode()


def usage(prompt_tokens, n):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": 0}}


def msg_event(kind, **fields):
    return ("event: %s\ndata: %s\n\n" % (kind, json.dumps(dict(type=kind, **fields)))).encode()


def msg_object(seq, model, content, stop_reason, usage):
    return {"id": "msg_stub_%d" % seq, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}


def msg_usage(prompt_tokens, n):
    return {"input_tokens": prompt_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": n}


def sse_events(kind, seq, model, n, prompt_tokens, include_usage, name):
    evs = []
    if kind == "messages":
        evs.append(msg_event("message_start", message=msg_object(
            seq, model, [], None, msg_usage(prompt_tokens, 1))))
        evs.append(msg_event("content_block_start", index=0,
                             content_block={"type": "text", "text": ""}))
        for i in range(n):
            evs.append(sse_chunk(kind, seq, model, "tok%d " % i, name))
        evs.append(msg_event("content_block_stop", index=0))
        evs.append(msg_event("message_delta", delta={"stop_reason": "end_turn",
                                                     "stop_sequence": None},
                             usage={"output_tokens": n}))
        evs.append(msg_event("message_stop"))
        return evs
    if kind == "responses":
        rid = "resp_stub_%d" % seq
        base = {"id": rid, "object": "response", "created_at": 1700000000, "model": model,
                "status": "in_progress", "output": []}
        evs.append(("event: response.created\ndata: " + json.dumps(
            {"type": "response.created", "response": base}) + "\n\n").encode())
        for i in range(n):
            evs.append(sse_chunk(kind, seq, model, "tok%d " % i, name))
        done = dict(base, status="completed", output=[{
            "type": "message", "id": "msg_stub", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "".join("tok%d " % i for i in range(n)),
                         "annotations": []}]}],
            usage={"input_tokens": prompt_tokens, "output_tokens": n,
                   "total_tokens": prompt_tokens + n})
        evs.append(("event: response.completed\ndata: " + json.dumps(
            {"type": "response.completed", "response": done}) + "\n\n").encode())
        return evs
    for i in range(n):
        evs.append(sse_chunk(kind, seq, model, "tok%d " % i, name))
    if kind == "chat":
        fin = {"id": "chatcmpl-stub-%d" % seq, "object": "chat.completion.chunk",
               "created": 1700000000, "model": model, "system_fingerprint": name,
               "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
    else:
        fin = {"id": "cmpl-stub-%d" % seq, "object": "text_completion", "created": 1700000000,
               "model": model, "choices": [{"index": 0, "text": "", "logprobs": None,
                                            "finish_reason": "stop"}]}
    evs.append(("data: " + json.dumps(fin) + "\n\n").encode())
    if include_usage:
        u = dict(fin, choices=[], usage=usage(prompt_tokens, n))
        evs.append(("data: " + json.dumps(u) + "\n\n").encode())
    evs.append(b"data: [DONE]\n\n")
    return evs


def json_body(kind, seq, model, n, prompt_tokens, name, kv_transfer_params=None):
    text = "".join("tok%d " % i for i in range(n))
    if kind == "chat":
        obj = {"id": "chatcmpl-stub-%d" % seq, "object": "chat.completion", "created": 1700000000,
               "model": model, "system_fingerprint": name,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                            "logprobs": None, "finish_reason": "stop"}],
               "usage": usage(prompt_tokens, n)}
    elif kind == "completions":
        obj = {"id": "cmpl-stub-%d" % seq, "object": "text_completion", "created": 1700000000,
               "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": "stop"}],
               "usage": usage(prompt_tokens, n)}
    elif kind == "messages":
        obj = msg_object(seq, model, [{"type": "text", "text": text}], "end_turn",
                         msg_usage(prompt_tokens, n))
    else:
        obj = {"id": "resp_stub_%d" % seq, "object": "response", "created_at": 1700000000,
               "model": model, "status": "completed",
               "output": [{"type": "message", "id": "msg_stub", "role": "assistant",
                           "status": "completed",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]}],
               "usage": {"input_tokens": prompt_tokens, "output_tokens": n,
                         "total_tokens": prompt_tokens + n}}
    if kv_transfer_params is not None:
        obj["kv_transfer_params"] = kv_transfer_params
    return json.dumps(obj).encode()


# -------------------------------------------------------------------- main
async def amain(args):
    stub = Stub(args)
    server = await asyncio.start_server(stub.handle_conn, args.host, args.port,
                                        reuse_address=True, backlog=256)
    stub.server = server
    port = server.sockets[0].getsockname()[1]
    if not args.name:
        stub.name = "stub-%d" % port
    sys.stdout.write("stub listening on %s:%d\n" % (args.host, port))
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port (printed on stdout)")
    ap.add_argument("--model", default="stub-model", help="the model /v1/models reports")
    ap.add_argument("--name", default="", help="worker name in x-stub-worker (default stub-PORT)")
    ap.add_argument("--mode", default="", help="default x-stub-mode directives")
    ap.add_argument("--events", type=int, default=5, help="SSE content events per response")
    ap.add_argument("--interval-ms", type=int, default=0, help="gap between SSE events")
    ap.add_argument("--health-status", type=int, default=200, help="status of GET /health")
    ap.add_argument("--models-status", type=int, default=200, help="status of GET /v1/models")
    args = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
