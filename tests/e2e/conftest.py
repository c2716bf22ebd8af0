"""Fixtures and helpers for kvroute's end-to-end tests.

Real processes on 127.0.0.1: the kvroute binary (from $KVROUTE_BUILD, default <repo>/build),
stub workers (tests/e2e/stub_worker.py) and kvroute-sim workers (same build dir; fixtures
`sim_factory` and `sim`, which must exit cleanly on SIGTERM). Every wait is bounded; every process a test starts is
stopped by pid at teardown (SIGTERM, then SIGKILL); kvroute's stderr goes to a file whose tail is
attached to the report of a failing test. After each test, every kvroute still running must show
kvroute_worker_inflight == 0 for all workers (checked at teardown).

Run: /usr/bin/python3 -m pytest -q tests/e2e
"""
import hashlib
import json
import os
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parents[1]
BUILD = Path(os.environ.get("KVROUTE_BUILD", str(REPO / "build")))
KVROUTE_BIN = BUILD / "kvroute"
SIM_BIN = BUILD / "kvroute-sim"
STUB = E2E_DIR / "stub_worker.py"
PY = sys.executable or "/usr/bin/python3"
MODEL = "stub-model"
SIM_MODEL = "sim-model"  # the model the kvroute-sim fixture serves

# httpx builds a TLS context (loading the CA bundle, ~45 ms) for every client unless given one;
# every httpx call here passes this one so a request costs what it should.
SSL_CTX = ssl.create_default_context()

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


# ============================================================================ small helpers
_HANDED_OUT = set()


def free_port():
    """A port that was free a moment ago (bind 127.0.0.1:0, read it, close), never one this
    process handed out before: two calls in a row (a kvroute's port and its admin port) could
    otherwise get the same port back from the kernel before either is bound."""
    for _ in range(1000):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise AssertionError("no fresh free port")


def wait_until(pred, timeout, interval=0.02, what="condition"):
    """Polls pred() until it returns a truthy value (returned) or `timeout` s pass (raises)."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - predicate errors are retried until the deadline
            last_exc = e
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s%s" % (
                timeout, what, (" (last error: %r)" % last_exc) if last_exc else ""))
        time.sleep(interval)


def chat_body(model=MODEL, stream=False, content="hello", **extra):
    b = {"model": model, "messages": [{"role": "user", "content": content}]}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


def completion_body(model=MODEL, stream=False, prompt="once upon a time", **extra):
    b = {"model": model, "prompt": prompt}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


def responses_body(model=MODEL, stream=False, input="hello", **extra):
    b = {"model": model, "input": input}
    if stream:
        b["stream"] = True
    b.update(extra)
    return b


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def assert_openai_error(resp_or_body, status=None):
    """Checks the OpenAI error shape {"error":{"message","type","param","code"}}."""
    if isinstance(resp_or_body, httpx.Response):
        if status is not None:
            assert resp_or_body.status_code == status, (
                "expected %d, got %d: %r" % (status, resp_or_body.status_code, resp_or_body.text[:300]))
        body = resp_or_body.content
    elif isinstance(resp_or_body, RawResponse):
        if status is not None:
            assert resp_or_body.status == status, "expected %d, got %r" % (status, resp_or_body)
        body = resp_or_body.body
    else:
        body = resp_or_body
    try:
        obj = json.loads(body)
    except Exception:
        raise AssertionError("error body is not JSON: %r" % body[:300])
    assert isinstance(obj, dict) and isinstance(obj.get("error"), dict), \
        "no error object: %r" % obj
    err = obj["error"]
    for k in ("message", "type", "param", "code"):
        assert k in err, "error object lacks %r: %r" % (k, obj)
    assert isinstance(err["message"], str) and err["message"], "empty error message: %r" % obj
    assert isinstance(err["type"], str) and err["type"], "empty error type: %r" % obj
    return err


def parse_sse(data):
    """SSE text (bytes or str) → list of events {"event": name or None, "data": str}."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    data = data.replace("\r\n", "\n")
    events = []
    for block in data.split("\n\n"):
        if not block.strip():
            continue
        ev = {"event": None, "data": None}
        lines = []
        for ln in block.split("\n"):
            if ln.startswith(":"):
                continue
            if ln.startswith("event:"):
                ev["event"] = ln[6:].strip()
            elif ln.startswith("data:"):
                lines.append(ln[5:][1:] if ln[5:].startswith(" ") else ln[5:])
        if lines:
            ev["data"] = "\n".join(lines)
        if ev["data"] is not None or ev["event"] is not None:
            events.append(ev)
    return events


# ============================================================================ metrics
_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


def _unescape(v):
    return v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


class Metrics:
    """Parsed Prometheus text exposition."""

    def __init__(self, text):
        self.text = text
        self.samples = []  # (name, labels dict, value)
        self.types = {}
        self.bad_lines = []
        for ln in text.splitlines():
            if not ln.strip():
                continue
            if ln.startswith("#"):
                parts = ln.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            m = _SAMPLE_RE.match(ln.strip())
            if not m:
                self.bad_lines.append(ln)
                continue
            name, _, lbl, val = m.group(1), m.group(2), m.group(3), m.group(4)
            labels = {}
            if lbl:
                pos = 0
                for lm in _LABEL_RE.finditer(lbl):
                    if lm.start() != pos:
                        self.bad_lines.append(ln)
                        break
                    labels[lm.group(1)] = _unescape(lm.group(2))
                    pos = lm.end()
                else:
                    if pos != len(lbl):
                        self.bad_lines.append(ln)
            try:
                value = float(val)
            except ValueError:
                self.bad_lines.append(ln)
                continue
            self.samples.append((name, labels, value))

    def find(self, name, **labels):
        """Samples of `name` whose labels include all of `labels` (a value may be a callable
        predicate)."""
        out = []
        for n, lb, v in self.samples:
            if n != name:
                continue
            ok = True
            for k, want in labels.items():
                have = lb.get(k)
                if callable(want):
                    if have is None or not want(have):
                        ok = False
                        break
                elif have != want:
                    ok = False
                    break
            if ok:
                out.append((lb, v))
        return out

    def get(self, name, **labels):
        """Sum of the values of the matching samples (0.0 when none)."""
        return sum(v for _, v in self.find(name, **labels))

    def has(self, name):
        return any(n == name for n, _, _ in self.samples)

    def family_names(self):
        return sorted({n for n, _, _ in self.samples})


# ============================================================================ raw HTTP client
class RawResponse:
    def __init__(self, status, reason, version, headers, body, framing, complete, raw_head):
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers  # list of (name lower, value)
        self.body = body  # de-chunked body bytes
        self.framing = framing  # "content-length", "chunked", "close", "none"
        self.complete = complete  # body framing completed (CL reached / last chunk seen)
        self.raw_head = raw_head
        self.t_head = None

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k == name.lower()]

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<RawResponse %s %s framing=%s complete=%s body=%r>" % (
            self.status, self.reason, self.framing, self.complete, self.body[:200])


class RawConn:
    """A client connection where the test controls every byte (bad input, pipelining,
    slow clients, disconnects)."""

    def __init__(self, port, timeout=5.0, rcvbuf=None, host="127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = bytearray()
        self.eof = False
        self.reset = False

    def send(self, data):
        if isinstance(data, str):
            data = data.encode("latin-1")
        self.sock.sendall(data)

    def _recv(self, deadline, n=65536):
        """Reads some bytes into buf; False on EOF/reset; raises TimeoutError at deadline."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("raw read timed out")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(n)
        except socket.timeout:
            raise TimeoutError("raw read timed out")
        except (ConnectionResetError, BrokenPipeError):
            self.eof = True
            self.reset = True
            return False
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_head(self, timeout=5.0):
        """Reads a status line and headers. Returns (status, reason, version, headers, raw)
        or None when the connection closed first."""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self._recv(deadline):
                return None
        i = self.buf.find(b"\r\n\r\n")
        raw = bytes(self.buf[:i])
        del self.buf[: i + 4]
        lines = raw.decode("latin-1").split("\r\n")
        m = re.match(r"^(HTTP/\d\.\d) (\d{3})(?: (.*))?$", lines[0])
        assert m, "bad status line %r" % lines[0]
        headers = []
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers.append((k.strip().lower(), v.strip()))
        return int(m.group(2)), m.group(3) or "", m.group(1), headers, raw

    def read_response(self, timeout=5.0, method="POST", allow_interim=False):
        """Reads one response (skipping 1xx unless allow_interim). Returns RawResponse, or None
        when the connection closed before a status line. A body cut short by a close gives
        complete=False."""
        deadline = time.monotonic() + timeout
        while True:
            head = self.read_head(max(0.0, deadline - time.monotonic()))
            if head is None:
                return None
            status, reason, version, headers, raw = head
            if 100 <= status < 200 and not allow_interim:
                continue
            break
        t_head = time.monotonic()
        hmap = {}
        for k, v in headers:
            hmap.setdefault(k, v)
        body = bytearray()
        complete = True
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing = "none"
        elif "chunked" in hmap.get("transfer-encoding", "").lower():
            framing = "chunked"
            complete = False
            while True:
                while b"\r\n" not in self.buf:
                    if not self._recv(deadline):
                        break
                if b"\r\n" not in self.buf:
                    break
                j = self.buf.find(b"\r\n")
                size = int(bytes(self.buf[:j]).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # the last chunk: wait for the terminating CRLF (no trailers expected)
                    while len(self.buf) < j + 4 and self._recv(deadline):
                        pass
                    if self.buf[j + 2: j + 4] == b"\r\n":
                        del self.buf[: j + 4]
                        complete = True
                    break
                while len(self.buf) < j + 2 + size + 2:
                    if not self._recv(deadline):
                        break
                if len(self.buf) < j + 2 + size + 2:
                    body += self.buf[j + 2: j + 2 + size]
                    del self.buf[:]
                    break
                body += self.buf[j + 2: j + 2 + size]
                del self.buf[: j + 2 + size + 2]
        elif "content-length" in hmap:
            framing = "content-length"
            n = int(hmap["content-length"])
            while len(self.buf) < n:
                if not self._recv(deadline):
                    break
            body += self.buf[:n]
            del self.buf[:n]
            complete = len(body) == n
        else:
            framing = "close"
            while self._recv(deadline):
                pass
            body += self.buf
            del self.buf[:]
        r = RawResponse(status, reason, version, headers, bytes(body), framing, complete, raw)
        r.t_head = t_head
        return r

    def iter_body(self, headers, timeout=10.0):
        """Yields (t_arrival, bytes) of the de-framed body as it arrives (chunked,
        Content-Length or close-delimited per `headers`, a list of (name, value)). Afterwards
        self.body_complete tells whether the framing completed (last chunk / CL reached)."""
        deadline = time.monotonic() + timeout
        hmap = {}
        for k, v in headers:
            hmap.setdefault(k, v)
        self.body_complete = False
        if "chunked" in hmap.get("transfer-encoding", "").lower():
            while True:
                while b"\r\n" not in self.buf:
                    if not self._recv(deadline):
                        return
                j = self.buf.find(b"\r\n")
                size = int(bytes(self.buf[:j]).split(b";")[0].strip() or b"0", 16)
                del self.buf[: j + 2]
                if size == 0:
                    while len(self.buf) < 2:
                        if not self._recv(deadline):
                            return
                    if self.buf[:2] == b"\r\n":
                        del self.buf[:2]
                        self.body_complete = True
                    return
                remaining = size
                while remaining > 0:
                    if not self.buf and not self._recv(deadline):
                        return
                    take = min(remaining, len(self.buf))
                    chunk = bytes(self.buf[:take])
                    del self.buf[:take]
                    remaining -= take
                    yield time.monotonic(), chunk
                while len(self.buf) < 2:
                    if not self._recv(deadline):
                        return
                assert self.buf[:2] == b"\r\n", "chunk data not followed by CRLF: %r" % bytes(self.buf[:20])
                del self.buf[:2]
        elif "content-length" in hmap:
            remaining = int(hmap["content-length"])
            while remaining > 0:
                if not self.buf and not self._recv(deadline):
                    return
                take = min(remaining, len(self.buf))
                chunk = bytes(self.buf[:take])
                del self.buf[:take]
                remaining -= take
                yield time.monotonic(), chunk
            self.body_complete = True
        else:
            while True:
                if self.buf:
                    chunk = bytes(self.buf)
                    del self.buf[:]
                    yield time.monotonic(), chunk
                if not self._recv(deadline):
                    self.body_complete = True  # close-delimited: EOF ends the body
                    return

    def iter_sse(self, headers, timeout=10.0):
        """Yields (t_arrival, event dict, raw event bytes) for each SSE event as it completes.
        Leftover bytes (an event cut short) are kept in self.sse_rest."""
        pending = b""
        self.sse_rest = b""
        for t, data in self.iter_body(headers, timeout):
            pending += data
            while True:
                pending_n = pending.replace(b"\r\n", b"\n")
                i = pending_n.find(b"\n\n")
                if i < 0:
                    break
                # keep the raw bytes simple: the stub and kvroute use LF line endings
                raw = pending_n[: i + 2]
                pending = pending_n[i + 2:]
                evs = parse_sse(raw)
                for ev in evs:
                    yield t, ev, raw
        self.sse_rest = pending

    def wait_closed(self, timeout=2.0):
        """True when the peer closed (EOF or reset) within `timeout` s; extra bytes received
        meanwhile are kept in buf."""
        deadline = time.monotonic() + timeout
        try:
            while self._recv(deadline):
                pass
            return True
        except TimeoutError:
            return False

    def close(self, rst=False):
        try:
            if rst:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     __import__("struct").pack("ii", 1, 0))
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def raw_request(port, data, timeout=5.0, close_timeout=1.5):
    """Sends `data` on a new connection and reads one response. Returns (response or None,
    closed) where closed says the server closed the connection within close_timeout s after
    the response."""
    with RawConn(port, timeout=timeout) as c:
        try:
            c.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            resp = c.read_response(timeout=timeout)
        except TimeoutError:
            return None, False  # no response and still open after `timeout` s
        closed = c.eof or c.wait_closed(close_timeout)
        return resp, closed


def http_post(port, path, body, headers=(), version="HTTP/1.1", host=True):
    """Builds a raw POST request."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    lines = ["POST %s %s" % (path, version)]
    if host:
        lines.append("Host: 127.0.0.1:%d" % port)
    lines.append("Content-Type: application/json")
    lines.append("Content-Length: %d" % len(body))
    lines.extend(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# ============================================================================ processes
class Proc:
    """A child process we started; stopped only by its pid."""

    def __init__(self, argv, stderr_path, stdout=subprocess.DEVNULL, env=None):
        # kvroute waits --shutdown-delay-ms (5000) after SIGTERM before it drains (Kubernetes
        # rollouts); tests stop it by SIGTERM all the time, so they run it without the delay
        # unless they set it themselves (test_k8s.py does).
        if (argv and Path(str(argv[0])).name == "kvroute"
                and "--shutdown-delay-ms" not in [str(a) for a in argv]):
            argv = list(argv) + ["--shutdown-delay-ms", "0"]
        self.argv = argv
        self.stderr_path = Path(stderr_path)
        self._errf = open(self.stderr_path, "wb")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout,
                                      stderr=self._errf, env=env, start_new_session=True)
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def returncode(self):
        return self.popen.poll()

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        """Waits up to `timeout` s; returns the exit code or None if still running."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=STOP_TIMEOUT_S):
        if self.alive():
            self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.signal(signal.SIGKILL)
                self.wait(timeout)
        self._close_files()

    def kill(self):
        if self.alive():
            self.signal(signal.SIGKILL)
            self.wait(STOP_TIMEOUT_S)

    def _close_files(self):
        try:
            self._errf.close()
        except Exception:
            pass
        if self.popen.stdout:
            try:
                self.popen.stdout.close()
            except Exception:
                pass

    def stderr_text(self, tail=None):
        try:
            t = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        if tail:
            t = "\n".join(t.splitlines()[-tail:])
        return t


class StubWorker:
    """A stub worker process (stub_worker.py)."""

    def __init__(self, registry, tmpdir, port=0, model=MODEL, name=None, mode=None, events=None,
                 interval_ms=None, health_status=None, models_status=None):
        self.registry = registry
        self.tmpdir = Path(tmpdir)
        self.opts = dict(model=model, name=name, mode=mode, events=events,
                         interval_ms=interval_ms, health_status=health_status,
                         models_status=models_status)
        self.port = port
        self.proc = None
        self.start()

    def start(self):
        o = self.opts
        argv = [PY, str(STUB), "--port", str(self.port), "--model", o["model"]]
        for flag, key in (("--name", "name"), ("--mode", "mode"), ("--events", "events"),
                          ("--interval-ms", "interval_ms"), ("--health-status", "health_status"),
                          ("--models-status", "models_status")):
            if o[key] is not None:
                argv += [flag, str(o[key])]
        n = len(self.registry.procs)
        self.proc = Proc(argv, self.tmpdir / ("stub-%d.stderr" % n), stdout=subprocess.PIPE)
        self.registry.procs.append(self.proc)
        out = self.proc.popen.stdout
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not self.proc.alive():
                self.proc.kill()
                raise RuntimeError("stub worker did not start: %s" % self.proc.stderr_text(20))
            r, _, _ = select.select([out], [], [], left)
            if r:
                ch = os.read(out.fileno(), 1)
                if not ch:
                    continue
                line += ch
        m = re.search(rb":(\d+)\s*$", line)
        assert m, "unexpected stub banner %r" % line
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port
        self.name = o["name"] or "stub-%d" % self.port

    def stop(self):
        self.proc.stop()

    def kill(self):
        self.proc.kill()

    def restart(self):
        """Starts again on the same port (after stop/kill)."""
        if self.proc.alive():
            self.proc.stop()
        self.start()

    def _admin(self, method, path, body=None):
        with httpx.Client(timeout=5.0, verify=SSL_CTX) as c:
            r = c.request(method, self.url + path, content=json.dumps(body).encode() if body is not None else None)
            r.raise_for_status()
            return r.json()

    def log(self):
        return self._admin("GET", "/stub/log")

    def requests(self, path=None, prefix="/v1/"):
        """Logged requests (by path, or all under `prefix`)."""
        out = []
        for e in self.log()["requests"]:
            if path is not None and e["path"] != path:
                continue
            if path is None and prefix and not e["path"].startswith(prefix):
                continue
            out.append(e)
        return out

    def proxied(self):
        """Requests to the three proxied OpenAI endpoints."""
        return [e for e in self.requests() if e["path"] in
                ("/v1/chat/completions", "/v1/completions", "/v1/responses")]

    def reset(self):
        return self._admin("POST", "/stub/reset", {})

    def config(self, **kw):
        return self._admin("POST", "/stub/config", kw)


class Sim:
    """A kvroute-sim process (docs/sim.md) on an ephemeral 127.0.0.1 port, started through the
    registry's process handling (stopped by pid at teardown, where a clean exit is required:
    status 0 after SIGTERM, no sanitizer report). `args` are extra sim flags, e.g.
    ("--time-scale", "0", "--kv-blocks", "64"); a later flag overrides an earlier one."""

    def __init__(self, registry, tmpdir, *args, model=SIM_MODEL):
        if not SIM_BIN.exists():
            msg = "kvroute-sim binary not built: %s (set KVROUTE_BUILD or run make)" % SIM_BIN
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
        self.registry = registry
        self.model = model
        # --port 0: the sim logs the port it bound ("listening ... addr=127.0.0.1:PORT", info)
        argv = [str(SIM_BIN), "--host", "127.0.0.1", "--port", "0", "--model", model,
                "--log-level", "info"] + [str(a) for a in args]
        self.argv = argv
        n = len(registry.procs)
        self.proc = Proc(argv, Path(tmpdir) / ("sim-%d.stderr" % n))
        self.pid = self.proc.pid
        registry.procs.append(self.proc)
        registry.sims.append(self)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            m = re.search(r'msg="kvroute-sim listening" addr=127\.0\.0\.1:(\d+)',
                          self.proc.stderr_text())
            if m:
                break
            if not self.proc.alive() or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("kvroute-sim did not start (exit %r): %s\n%s" % (
                    self.proc.returncode(), " ".join(argv), self.proc.stderr_text(20)))
            time.sleep(0.01)
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port
        self.client = httpx.Client(base_url=self.url, timeout=10.0, verify=SSL_CTX)
        while True:
            try:
                self.client.get("/health", timeout=0.5)  # any answer: a test may set 503
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("kvroute-sim not answering within %.0fs" % START_TIMEOUT_S)
                time.sleep(0.02)

    def read_log(self):
        return self.proc.stderr_text()

    def stop(self):
        """SIGTERM (then SIGKILL after STOP_TIMEOUT_S); returns the exit status."""
        self.client.close()
        self.proc.stop()
        return self.proc.returncode()

    # --- helpers
    def chat(self, messages, max_tokens=16, **kw):
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, **kw}
        r = self.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def tokenize(self, **body):
        r = self.client.post("/tokenize", json=body)
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    def metrics(self):
        r = self.client.get("/metrics")
        assert r.status_code == 200, "sim GET /metrics → %d" % r.status_code
        return Metrics(r.text)

    def stats(self):
        return self.client.get("/sim/stats").json()

    def faults(self, **kw):
        """POST /sim/faults with `kw` (fail_rate, fail_status, delay_ms, stall_after_events,
        drop_after_events, health_status); returns the settings now in force."""
        r = self.client.post("/sim/faults", json=kw)
        assert r.status_code == 200, r.text
        return r.json()


def header_value(entry, name):
    """First value of header `name` (case-insensitive) in a stub log entry, or None."""
    for k, v in entry["headers"]:
        if k.lower() == name.lower():
            return v
    return None


def header_values(entry, name):
    return [v for k, v in entry["headers"] if k.lower() == name.lower()]


class Kvroute:
    """A kvroute process under test."""

    def __init__(self, registry, tmpdir, workers, model=MODEL, policy="round_robin",
                 health_interval_ms=None, extra=(), port=None, wait_ready=True,
                 check_inflight=True):
        if not KVROUTE_BIN.exists():
            msg = "kvroute binary not built: %s (set KVROUTE_BUILD or run make)" % KVROUTE_BIN
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
        self.registry = registry
        self.port = port or free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.workers = [getattr(w, "url", w) for w in workers]  # StubWorker, Sim or a URL
        self.check_inflight = check_inflight
        argv = [str(KVROUTE_BIN)]
        for w in self.workers:
            argv += ["--worker", w]
        if model is not None:
            argv += ["--model", model]
        if policy is not None:
            argv += ["--policy", policy]
        if health_interval_ms is not None:
            argv += ["--health-interval-ms", str(health_interval_ms)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        if os.environ.get("KVROUTE_LOG_LEVEL"):
            argv += ["--log-level", os.environ["KVROUTE_LOG_LEVEL"]]
        # KVROUTE_UPSTREAM_CLIENT=native|curl: which HTTP client talks to the workers (the
        # Makefile's test target runs the upstream-related files once more with curl)
        if os.environ.get("KVROUTE_UPSTREAM_CLIENT"):
            argv += ["--upstream-client", os.environ["KVROUTE_UPSTREAM_CLIENT"]]
        argv += [str(a) for a in extra]
        self.argv = argv
        n = len(registry.procs)
        self.proc = Proc(argv, Path(tmpdir) / ("kvroute-%d.stderr" % n))
        self.pid = self.proc.pid
        registry.procs.append(self.proc)
        registry.kvroutes.append(self)
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            if not self.proc.alive():
                raise AssertionError("kvroute exited with %r before serving; argv=%s\nstderr:\n%s" % (
                    self.proc.returncode(), " ".join(self.argv), self.proc.stderr_text(40)))
            if "listening" in self.proc.stderr_text():
                try:
                    r = httpx.get(self.url + "/healthz", timeout=1.0, verify=SSL_CTX)
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError("kvroute not ready within %.0fs (no 'listening' on stderr or "
                                     "/healthz not 200); stderr:\n%s" % (timeout, self.proc.stderr_text(40)))
            time.sleep(0.02)

    # --- HTTP helpers (bounded by httpx timeouts)
    def get(self, path, timeout=10.0, **kw):
        return httpx.get(self.url + path, timeout=timeout, verify=SSL_CTX, **kw)

    def post(self, path, json_body=None, content=None, headers=None, timeout=10.0):
        if content is None and json_body is not None:
            content = json.dumps(json_body).encode()
        h = {"content-type": "application/json"}
        h.update(headers or {})
        return httpx.post(self.url + path, content=content, headers=h, timeout=timeout,
                          verify=SSL_CTX)

    def chat(self, headers=None, timeout=10.0, **body_kw):
        return self.post("/v1/chat/completions", chat_body(**body_kw), headers=headers, timeout=timeout)

    def metrics(self):
        r = self.get("/metrics", timeout=5.0)
        assert r.status_code == 200, "GET /metrics → %d" % r.status_code
        m = Metrics(r.text)
        m.content_type = r.headers.get("content-type", "")
        return m

    def inflight(self):
        m = self.metrics()
        return {lb.get("worker"): v for lb, v in m.find("kvroute_worker_inflight")}

    def wait_inflight_zero(self, timeout=3.0):
        last = {}

        def ok():
            nonlocal last
            last = self.inflight()
            return all(v == 0 for v in last.values())
        try:
            wait_until(ok, timeout, interval=0.05, what="kvroute_worker_inflight == 0")
        except AssertionError:
            raise AssertionError("kvroute_worker_inflight did not return to 0 within %.1fs: %r"
                                 % (timeout, last))
        return last

    def rss_bytes(self):
        with open("/proc/%d/status" % self.pid) as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) * 1024
        raise AssertionError("no VmRSS for pid %d" % self.pid)

    def assert_serving(self, stub=None, what=""):
        """The router still answers a normal request (and is alive)."""
        assert self.proc.alive(), "kvroute died%s (exit %r); stderr:\n%s" % (
            (" after " + what) if what else "", self.proc.returncode(), self.proc.stderr_text(30))
        r = self.chat(timeout=5.0)
        assert r.status_code == 200, "router stopped serving%s: POST chat → %d %r" % (
            (" after " + what) if what else "", r.status_code, r.text[:300])
        return r

    def stop(self):
        self.proc.stop()


class Registry:
    def __init__(self):
        self.procs = []
        self.kvroutes = []
        self.sims = []

    def teardown(self, item=None, check=True):
        errors = []
        if check:
            for kv in self.kvroutes:
                if kv.check_inflight and kv.proc.alive():
                    try:
                        kv.wait_inflight_zero(timeout=3.0)
                    except Exception as e:  # noqa: BLE001
                        errors.append("kvroute pid %d: %s" % (kv.pid, e))
        for p in reversed(self.procs):
            p.stop()
        for sim in self.sims:  # kvroute-sim must exit cleanly on SIGTERM (status 0, no report)
            try:
                sim.client.close()
            except Exception:  # noqa: BLE001
                pass
            rc = sim.proc.returncode()
            text = sim.proc.stderr_text()
            bad = next((mk for mk in SANITIZER_MARKERS if mk in text), None)
            if bad or (check and rc != 0):
                errors.append("kvroute-sim pid %d exited %r after SIGTERM (want 0)%s:\n%s" % (
                    sim.pid, rc, ", sanitizer report" if bad else "", text[-4000:]))
        for kv in self.kvroutes:  # an ASan/UBSan build (KVROUTE_BUILD=build-asan) reports here
            text = kv.proc.stderr_text()
            for marker in SANITIZER_MARKERS:
                i = text.find(marker)
                if i >= 0:
                    errors.append("kvroute pid %d: sanitizer report in %s:\n%s" % (
                        kv.pid, kv.proc.stderr_path, text[max(0, i - 200): i + 3000]))
                    break
        if item is not None:
            for kv in self.kvroutes:
                tail = kv.proc.stderr_text(tail=60)
                if tail:
                    item.add_report_section("teardown", "kvroute pid %d stderr (%s)" % (
                        kv.pid, kv.proc.stderr_path), tail)
        self.procs.clear()
        self.kvroutes.clear()
        self.sims.clear()
        return errors


# ============================================================================ fixtures
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def procs(request, tmp_path):
    reg = Registry()
    yield reg
    rep = getattr(request.node, "rep_call", None)
    failed = rep is not None and rep.failed
    errors = reg.teardown(item=request.node if failed else None, check=not failed)
    if errors:
        pytest.fail("after the test: " + "; ".join(errors), pytrace=False)


@pytest.fixture
def stub(procs, tmp_path):
    """Factory: stub(model=..., name=..., mode=..., events=..., interval_ms=..., port=...)."""
    def make(**kw):
        return StubWorker(procs, tmp_path, **kw)
    return make


@pytest.fixture
def sim_factory(procs, tmp_path):
    """Factory: sim_factory(*flags, model=SIM_MODEL) starts a kvroute-sim (see Sim), e.g.
    sim_factory("--time-scale", "0.01", "--kv-blocks", "64")."""
    def make(*args, **kw):
        return Sim(procs, tmp_path, *args, **kw)
    return make


@pytest.fixture
def sim(sim_factory):
    """One kvroute-sim that never sleeps (--time-scale 0)."""
    return sim_factory("--time-scale", "0")


@pytest.fixture
def kvroute(procs, tmp_path):
    """Factory: kvroute(workers, model=MODEL, policy="round_robin", health_interval_ms=None,
    extra=[flags...], wait_ready=True)."""
    def make(workers, **kw):
        return Kvroute(procs, tmp_path, workers, **kw)
    return make


@pytest.fixture
def one(stub, kvroute):
    """One stub worker behind one kvroute (round_robin, health checks off)."""
    w = stub()
    kv = kvroute([w], health_interval_ms=0)
    return kv, w


@pytest.fixture(scope="module")
def module_procs(request, tmp_path_factory):
    reg = Registry()
    reg.tmpdir = tmp_path_factory.mktemp(request.module.__name__.split(".")[-1])
    yield reg
    errors = reg.teardown(check=False)
    if errors:
        pytest.fail("module teardown: " + "; ".join(errors), pytrace=False)
