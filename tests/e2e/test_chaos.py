"""Chaos replay, short version (docs/operations.md, "Chaos replay"): scripts/chaos.py replays the
tau-bench trace through kvroute over 4 kvroute-sim workers for 30 s while its seeded fault
schedule kills and restarts a worker, SIGSTOPs one, switches one to 5xx and stalls or drops
streams. Every request must end complete or cleanly failed (none lost), kvroute's in-flight
gauges must return to 0, kvroute must survive, exit 0 on SIGTERM and, under build-asan, show no
sanitizer report; the faults must really have happened (a kill, retried requests).

test_chaos_judge checks the script's classification itself against canned answers (complete,
cut, hung, non-OpenAI errors), so a broken judge cannot pass a broken router.

The script stops every process it started by pid; here it gets SIGTERM (it then undoes the
faults and stops its fleet) if it overruns its bound, and SIGKILL only after that.
"""
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KVROUTE_BUILD", str(REPO / "build")))
CHAOS = REPO / "scripts" / "chaos.py"
PY = sys.executable or "/usr/bin/python3"
DURATION_S = 30
# The load, then at worst: clients finishing (2 client deadlines + 10 s), in-flight wait (30 s),
# recovery check (20 s), stops.
BOUND_S = DURATION_S + 240


def run_chaos(tmp_path, seed):
    for b in ("kvroute", "kvroute-sim"):
        if not (BUILD / b).exists():
            msg = "%s not built (set KVROUTE_BUILD or run make)" % (BUILD / b)
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
    out = tmp_path / "chaos.json"
    argv = [PY, str(CHAOS), "--duration", str(DURATION_S), "--seed", str(seed),
            "--build", str(BUILD), "--json", str(out)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = p.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # chaos.py stops its fleet on SIGTERM
        try:
            text, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate(timeout=10)
        pytest.fail("chaos.py overran %d s:\n%s" % (BOUND_S, text[-6000:]))
    assert out.exists(), "chaos.py wrote no summary (exit %d):\n%s" % (p.returncode, text[-6000:])
    return p.returncode, json.loads(out.read_text()), text


def test_chaos_replay_loses_nothing(tmp_path):
    rc, s, text = run_chaos(tmp_path, seed=1)
    why = "\n%s\nsummary: %s" % (text[-8000:], json.dumps(
        {k: s.get(k) for k in ("requests", "ok", "retried", "failed_clean", "lost", "faults",
                               "checks", "failures", "lost_requests")}, indent=1)[:8000])
    assert "requests" in s, "chaos.py did not run (exit %d):%s" % (rc, why)
    assert s["lost"] == 0, "requests lost:" + why
    assert not s["failures"], "checks failed:" + why
    assert all(s["checks"].values()), "checks failed:" + why
    assert rc == 0, "chaos.py exit %d:%s" % (rc, why)
    # The replay really ran, and the faults really happened.
    assert s["requests"] >= 100 and s["ok"] >= s["requests"] // 2, why
    assert s["faults"].get("kill", 0) >= 1 and s["worker_restarts"] >= 1, why
    assert s["faults"].get("stop", 0) >= 1 and s["faults"].get("http500", 0) >= 1, why
    assert s["retried"] > 0, "no request was retried:" + why
    assert s["requests"] == s["ok"] + s["failed_clean"] + s["lost"]


# ---------------------------------------------------------------- the judge itself
def _load_chaos():
    spec = importlib.util.spec_from_file_location("chaos", CHAOS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sse(*datas):
    return "".join("data: %s\n\n" % d for d in datas).encode()


def _chunked(body, end=True):
    out = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    return out + (b"0\r\n\r\n" if end else b"")


def _chunk(i, content=None, finish=None, role=False):
    delta = {"role": "assistant", "content": ""} if role else {"content": content}
    return json.dumps({"id": "c1", "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}]})


GOOD_SSE = _sse(_chunk(0, role=True), _chunk(1, "a"), _chunk(2, " b", "length"), "[DONE]")
ERR = json.dumps({"error": {"message": "worker failed", "type": "server_error", "param": None,
                            "code": "upstream_error"}})
HEAD_SSE = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nx-kvroute-attempts: 2\r\n\r\n")


def _json_head(status, ctype, body):
    return (b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
            % (status, ctype.encode(), len(body))) + body


def _complete_json(ntok):
    return json.dumps({"choices": [{"message": {"content": "a b"}, "finish_reason": "length"}],
                       "usage": {"completion_tokens": ntok}}).encode()


@pytest.mark.parametrize("name,stream,raw,want", [
    ("sse complete", True, HEAD_SSE + _chunked(GOOD_SSE), "ok"),
    ("sse error event", True, HEAD_SSE + _chunked(_sse(_chunk(0, role=True), ERR)), "failed_clean"),
    ("sse cut mid-stream", True, HEAD_SSE + _chunked(_sse(_chunk(0, role=True)), end=False), "lost"),
    ("sse no [DONE]", True, HEAD_SSE + _chunked(_sse(_chunk(0, role=True), _chunk(1, "a"))), "lost"),
    ("sse [DONE] but short", True, HEAD_SSE + _chunked(_sse(_chunk(1, "a", "length"), "[DONE]")), "lost"),
    ("json complete", False, _json_head(200, "application/json", _complete_json(2)), "ok"),
    ("json short", False, _json_head(200, "application/json", _complete_json(1)), "lost"),
    ("json truncated", False, _json_head(200, "application/json", _complete_json(2))[:-5], "lost"),
    ("openai 502", False, _json_head(502, "application/json", ERR.encode()), "failed_clean"),
    ("html 502", False, _json_head(502, "text/html", b"<h1>bad gateway</h1>"), "lost"),
    ("reset before headers", False, b"", "lost"),
    ("hang", True, b"HANG", "lost"),
])
def test_chaos_judge(name, stream, raw, want):
    """chaos.py's classification, against a socket that answers `raw` and closes (or hangs)."""
    chaos = _load_chaos()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)

    def serve():
        try:
            c, _ = srv.accept()
        except OSError:
            return
        with c:
            c.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += c.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            while len(rest) < n:
                rest += c.recv(65536)
            if raw == b"HANG":
                time.sleep(2.5)
                return
            c.sendall(raw)
    th = threading.Thread(target=serve, daemon=True)
    th.start()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    if stream:
        body["stream"] = True
    o = chaos.Outcome("rid-1", "conv", 0, stream, 0.0)
    with httpx.Client() as client:
        chaos.do_request(client, "http://127.0.0.1:%d/v1/chat/completions" % srv.getsockname()[1],
                         body, o, deadline_s=1.0)
    th.join(timeout=10)
    srv.close()
    assert o.cls == want, "%s: classified %s (%s)" % (name, o.cls, o.why)
