#!/usr/bin/python3
"""Chaos replay: the tau-bench trace through kvroute over 4 kvroute-sim workers while a seeded
fault schedule kills, restarts, stops and breaks the workers. Usage: docs/operations.md
("Chaos replay").

    scripts/chaos.py [--duration S] [--concurrency N] [--seed S] [--build DIR] [--json [OUT]]

Every request must end as `ok` (a complete 200: the JSON parsed, or an SSE stream ending in
`data: [DONE]`) or `failed_clean` (an OpenAI-shaped error status with a JSON error body, or an
SSE stream whose last event is `data: {"error":...}` followed by a clean end). Anything else
is `lost`: no answer within the client deadline, a truncated body, a reset connection, a
non-OpenAI error. At the end kvroute's in-flight gauges must return to 0, kvroute must be the
same live process, answer again once the faults stop, exit 0 on SIGTERM and show no sanitizer
report. Exit status: 0 when every check passed and lost == 0, 1 otherwise, 2 on bad usage or
when the fleet could not start.

Every process started here listens on 127.0.0.1 only, is recorded by pid and stopped by pid
(SIGCONT, SIGTERM, then SIGKILL after a bounded wait), also on SIGINT/SIGTERM and on errors.
Every wait is bounded.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "tau-bench-airline-gpt4o" / "trajectories.jsonl"
MODEL = "chaos-model"
NWORKERS = 4
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "LeakSanitizer",
                     "runtime error:")
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0

# kvroute's deadlines for the run (short, so a fault costs seconds, not minutes) and the
# client's deadline derived from them.
CONNECT_TIMEOUT_MS = 1000
FIRST_BYTE_TIMEOUT_MS = 4000
STREAM_IDLE_TIMEOUT_MS = 3000
MAX_RETRIES = 2
HEALTH_INTERVAL_MS = 500
DRAIN_TIMEOUT_S = 5


def log(msg):
    sys.stderr.write("chaos: %s\n" % msg)
    sys.stderr.flush()


# ============================================================================ processes
class Proc:
    """A child process whose stdout+stderr are appended to `logpath`."""

    def __init__(self, argv, logpath):
        self.argv = [str(a) for a in argv]
        self.logpath = Path(logpath)
        self.log_offset = self.logpath.stat().st_size if self.logpath.exists() else 0
        self.f = open(self.logpath, "ab")
        # Own session: a terminal's ^C reaches only this script, which stops the children.
        self.p = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.f,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.p.pid
        self.stopped = False  # SIGSTOPped by us

    def alive(self):
        return self.p.poll() is None

    def returncode(self):
        return self.p.poll()

    def text(self, since_start=True):
        try:
            with open(self.logpath, "rb") as f:
                if since_start:
                    f.seek(self.log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def sigstop(self):
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self):
        self.signal(signal.SIGCONT)
        self.stopped = False

    def kill(self):
        """SIGKILL and reap (bounded)."""
        self.signal(signal.SIGKILL)
        try:
            self.p.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        self.f.close()

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGCONT + SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
        if self.alive():
            self.sigcont()
            self.signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                try:
                    self.p.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        self.f.close()
        return self.p.poll()


def port_is_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_ports(n):
    """n free ports below the kernel's ephemeral range, so a port a killed worker leaves cannot be
    taken meanwhile as the local port of some outgoing connection (the worker restarts on it)."""
    lo = 32768
    try:
        lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    hi = lo if lo > 12000 else 65536
    base = 10000 if lo > 12000 else max(lo, 61000)
    r = random.SystemRandom()
    ports = []
    for _ in range(2000):
        p = r.randrange(base, hi)
        if p not in ports and port_is_free(p):
            ports.append(p)
            if len(ports) == n:
                return ports
    raise RuntimeError("could not find %d free ports" % n)


class Sim:
    """One kvroute-sim worker on a fixed 127.0.0.1 port; restartable on the same port."""

    def __init__(self, build, idx, port, seed, workdir, time_scale):
        self.idx = idx
        self.port = port
        self.url = "http://127.0.0.1:%d" % port
        self.name = "w%d" % idx
        self.logpath = Path(workdir) / ("sim-%d.log" % idx)
        self.argv = [Path(build) / "kvroute-sim", "--host", "127.0.0.1", "--port", port,
                     "--model", MODEL, "--time-scale", time_scale, "--seed", seed + idx,
                     "--log-level", "info"]
        self.proc = None
        self.procs = []  # every process this worker was (restarts)
        self.down = False

    def start(self):
        last = ""
        for _ in range(3):  # the port may be busy for a moment after a SIGKILL
            self.proc = Proc(self.argv, self.logpath)
            self.procs.append(self.proc)
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.alive():
                if "kvroute-sim listening" in self.proc.text():
                    try:
                        httpx.get(self.url + "/health", timeout=1.0)
                        self.down = False
                        return
                    except httpx.HTTPError:
                        pass
                time.sleep(0.02)
            last = self.proc.text()[-2000:]
            self.proc.kill()
            time.sleep(0.5)
        raise RuntimeError("kvroute-sim %s did not start on port %d:\n%s" % (self.name, self.port, last))

    def faults(self, **kw):
        """POST /sim/faults (bounded). Returns True when the sim took them."""
        try:
            r = httpx.post(self.url + "/sim/faults", json=kw, timeout=3.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False


class Kvroute:
    def __init__(self, build, port, workers, workdir, seed, extra=(), log_level="info"):
        self.port = port
        self.url = "http://127.0.0.1:%d" % port
        argv = [Path(build) / "kvroute"]
        for w in workers:
            argv += ["--worker", w.url]
        argv += ["--model", MODEL, "--policy", "cache_aware", "--host", "127.0.0.1",
                 "--port", port, "--seed", seed or 1,
                 "--health-interval-ms", HEALTH_INTERVAL_MS,
                 "--connect-timeout-ms", CONNECT_TIMEOUT_MS,
                 "--first-byte-timeout-ms", FIRST_BYTE_TIMEOUT_MS,
                 "--stream-idle-timeout-ms", STREAM_IDLE_TIMEOUT_MS,
                 "--max-retries", MAX_RETRIES,
                 "--scrape-interval", 1,
                 "--drain-timeout", DRAIN_TIMEOUT_S,
                 "--shutdown-delay-ms", 0,  # no load balancer to wait for here
                 # concurrency per worker (docs/operations.md, "Sizing the overload gate")
                 "--balance-abs-threshold", 2,
                 "--log-level", log_level]
        argv += list(extra)
        self.proc = Proc(argv, Path(workdir) / "kvroute.log")
        self.pid = self.proc.pid

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.proc.alive():
                break
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("kvroute not ready (exit %r):\n%s" % (self.proc.returncode(),
                                                                 self.proc.text()[-3000:]))

    def metrics(self):
        r = httpx.get(self.url + "/metrics", timeout=5.0)
        r.raise_for_status()
        return parse_metrics(r.text)


_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text → list of (name, labels, value)."""
    out = []
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        m = _SAMPLE_RE.match(ln)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL_RE.findall(m.group(2) or "")), v))
    return out


def metric_by(samples, name, label):
    """{label value: summed value} for family `name`."""
    d = {}
    for n, lb, v in samples:
        if n == name:
            k = lb.get(label, "")
            d[k] = d.get(k, 0) + v
    return d


# ============================================================================ the trace
def load_trace(path, max_tokens_cap):
    convs = []
    with open(path, encoding="utf-8") as f:
        for ln in f:
            ln = ln.strip()
            if not ln:
                continue
            row = json.loads(ln)
            msgs = row.get("messages")
            if not isinstance(msgs, list):
                continue
            turns = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and i > 0]
            if turns:
                convs.append({"name": "tau-task%s-trial%s" % (row.get("task_id"), row.get("trial")),
                              "messages": msgs, "turns": turns, "cap": max_tokens_cap})
    return convs


def recorded_len(m):
    """⌈bytes / 4⌉ of an assistant message's text and tool calls (kvroute-bench's estimate)."""
    n = len((m.get("content") or "").encode())
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") or {}
        n += len((fn.get("name") or "").encode()) + len((fn.get("arguments") or "").encode())
    return max(1, math.ceil(n / 4))


# ============================================================================ one request
class Outcome:
    __slots__ = ("rid", "conv", "turn", "stream", "cls", "why", "status", "attempts", "worker",
                 "elapsed", "t_start", "text", "tail", "error_code")

    def __init__(self, rid, conv, turn, stream, t_start):
        self.rid, self.conv, self.turn, self.stream = rid, conv, turn, stream
        self.t_start = t_start
        self.cls = None
        self.why = ""
        self.status = None
        self.attempts = None
        self.worker = None
        self.elapsed = None
        self.text = None
        self.tail = b""
        self.error_code = None

    def as_dict(self):
        return {"request_id": self.rid, "conversation": self.conv, "turn": self.turn,
                "stream": self.stream, "class": self.cls, "why": self.why,
                "status": self.status, "attempts": self.attempts, "worker": self.worker,
                "t_start_s": round(self.t_start, 3),
                "elapsed_s": round(self.elapsed, 3) if self.elapsed is not None else None,
                "error_code": self.error_code,
                "body_tail": self.tail[-400:].decode("utf-8", "replace")}


def openai_error(body):
    """The error object of an OpenAI error body, or None."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), dict):
        return None
    err = obj["error"]
    if not isinstance(err.get("message"), str) or not err["message"]:
        return None
    return err


def classify_sse(o, raw, max_tokens, want_usage):
    """Classifies a complete (cleanly ended) SSE body."""
    text = raw.decode("utf-8", "replace").replace("\r\n", "\n")
    if text and not text.endswith("\n\n"):
        o.cls, o.why = "lost", "stream ended inside an SSE event (truncated)"
        return
    datas = []
    for block in text.split("\n\n"):
        lines = [ln[5:].lstrip(" ") if ln.startswith("data:") else None
                 for ln in block.split("\n") if ln and not ln.startswith(":")]
        lines = [x for x in lines if x is not None]
        if lines:
            datas.append("\n".join(lines))
    if not datas:
        o.cls, o.why = "lost", "empty stream"
        return
    last = datas[-1]
    if last == "[DONE]":
        # Complete means all of it: one id, max_tokens token chunks (the sim always generates
        # max_tokens), the last with finish_reason "length", and the usage chunk if asked for.
        parts, ids, finish, usage, ntok = [], set(), None, None, 0
        for d in datas[:-1]:
            try:
                ev = json.loads(d)
            except ValueError:
                o.cls, o.why = "lost", "non-JSON SSE event %r" % d[:120]
                return
            if not isinstance(ev, dict) or "error" in ev:
                o.cls, o.why = "lost", "error event followed by [DONE]"
                return
            ids.add(ev.get("id"))
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                if "role" not in delta and "content" in delta:
                    ntok += 1
                parts.append(delta.get("content") or "")
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        bad = []
        if len(ids) != 1:
            bad.append("%d chunk ids" % len(ids))
        if ntok != max_tokens:
            bad.append("%d token chunks for max_tokens %d" % (ntok, max_tokens))
        if finish != "length":
            bad.append("finish_reason %r" % finish)
        if want_usage and (not usage or usage.get("completion_tokens") != max_tokens):
            bad.append("usage %r" % usage)
        if bad:
            o.cls, o.why = "lost", "stream ended in [DONE] but is incomplete: " + ", ".join(bad)
            return
        o.cls, o.text = "ok", "".join(parts)
        return
    err = openai_error(last)
    if err is not None:
        if "[DONE]" in datas:
            o.cls, o.why = "lost", "events after [DONE]"
            return
        o.cls, o.why, o.error_code = "failed_clean", "SSE error event", err.get("code")
        return
    o.cls, o.why = "lost", "stream ended without [DONE] or an error event (last %r)" % last[:120]


def do_request(client, url, body, o, deadline_s):
    """Sends one chat request; fills `o` (class, status, attempts, text)."""
    t0 = time.monotonic()
    buf = bytearray()
    timeout = httpx.Timeout(connect=5.0, read=deadline_s, write=10.0, pool=5.0)
    try:
        with client.stream("POST", url, json=body, timeout=timeout,
                           headers={"x-request-id": o.rid}) as r:
            o.status = r.status_code
            o.attempts = r.headers.get("x-kvroute-attempts")
            o.worker = r.headers.get("x-kvroute-worker")
            ctype = r.headers.get("content-type", "")
            for chunk in r.iter_bytes():
                buf += chunk
                if time.monotonic() - t0 > deadline_s:
                    o.cls, o.why = "lost", "still receiving at the client deadline (%.0fs)" % deadline_s
                    break
    except httpx.TimeoutException as e:
        o.cls, o.why = "lost", "timeout (%s) after %.1fs" % (type(e).__name__, time.monotonic() - t0)
    except httpx.HTTPError as e:
        o.cls, o.why = "lost", "%s: %s" % (type(e).__name__, e)
    o.elapsed = time.monotonic() - t0
    o.tail = bytes(buf[-600:])
    if o.cls is not None:
        return
    if o.elapsed > deadline_s:
        o.cls, o.why = "lost", "answered after the client deadline (%.1fs)" % o.elapsed
        return
    if o.status == 200:
        if body.get("stream"):
            if "text/event-stream" not in ctype:
                o.cls, o.why = "lost", "200 stream with content-type %r" % ctype
                return
            classify_sse(o, bytes(buf), body["max_tokens"],
                         bool((body.get("stream_options") or {}).get("include_usage")))
            return
        try:
            obj = json.loads(bytes(buf))
            ch = obj["choices"][0]
            o.text = ch["message"].get("content") or ""
            ntok = obj["usage"]["completion_tokens"]
            fin = ch.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            o.cls, o.why = "lost", "200 with an unparsable body"
            return
        if ntok != body["max_tokens"] or fin != "length":
            o.cls, o.why = "lost", "200 JSON but incomplete: completion_tokens %r for max_tokens %d, " \
                "finish_reason %r" % (ntok, body["max_tokens"], fin)
            return
        o.cls = "ok"
        return
    err = openai_error(bytes(buf))
    if err is not None and o.status >= 400:
        o.cls, o.why, o.error_code = "failed_clean", "HTTP %d" % o.status, err.get("code")
    else:
        o.cls, o.why = "lost", "HTTP %d without an OpenAI error body" % o.status


# ============================================================================ the replay
class Replay:
    def __init__(self, args, kv_url, convs, deadline_s, t0):
        self.args = args
        self.url = kv_url + "/v1/chat/completions"
        self.convs = convs
        self.deadline_s = deadline_s
        self.t0 = t0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.results = []
        self.next_session = 0
        order = list(range(len(convs)))
        random.Random("order-%d" % args.seed).shuffle(order)
        self.order = order

    def take_session(self):
        with self.lock:
            k = self.next_session
            self.next_session += 1
        epoch, i = divmod(k, len(self.order))
        return epoch, self.order[i]

    def run_thread(self, tid):
        client = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        try:
            while not self.stop.is_set():
                epoch, ci = self.take_session()
                client = self.run_session(client, epoch, ci)
        finally:
            client.close()

    def run_session(self, client, epoch, ci):
        conv = self.convs[ci]
        msgs = conv["messages"]
        history = []  # messages sent so far, assistant turns as answered
        pos = 0
        for turn, ai in enumerate(conv["turns"]):
            if self.stop.is_set():
                break
            history.extend(msgs[pos:ai])
            pos = ai + 1
            rec = msgs[ai]
            # Everything about the request is a function of (seed, epoch, conversation, turn).
            rng = random.Random("%d-%d-%d-%d" % (self.args.seed, epoch, ci, turn))
            stream = rng.random() < 0.5
            body = {"model": MODEL, "messages": list(history),
                    "max_tokens": min(recorded_len(rec), conv["cap"])}
            if stream:
                body["stream"] = True
                if rng.random() < 0.5:
                    body["stream_options"] = {"include_usage": True}
            rid = "chaos-%d-e%d-c%d-t%d" % (self.args.seed, epoch, ci, turn)
            o = Outcome(rid, conv["name"], turn, stream, time.monotonic() - self.t0)
            do_request(client, self.url, body, o, self.deadline_s)
            with self.lock:
                self.results.append(o)
            if o.cls == "lost":
                log("LOST %s (%s, stream=%s, status=%s, worker=%s, %.1fs): %s" % (
                    o.rid, conv["name"], stream, o.status, o.worker, o.elapsed, o.why))
                client.close()  # the connection's state is unknown: start afresh
                client = httpx.Client(limits=httpx.Limits(max_connections=1,
                                                          max_keepalive_connections=1))
            # The next turn carries this answer (the recorded tool calls kept, so the tool
            # messages that follow still answer a call); the recorded one when it failed.
            if o.cls == "ok":
                a = {"role": "assistant", "content": o.text}
                if rec.get("tool_calls"):
                    a["tool_calls"] = rec["tool_calls"]
                history.append(a)
            else:
                history.append(rec)
            if self.args.think_ms > 0:
                self.stop.wait(rng.expovariate(1000.0 / self.args.think_ms))
        return client


# ============================================================================ faults
FAULT_KINDS = ("kill", "stop", "http500", "stall", "drop", "unhealthy", "delay")


def make_schedule(seed, duration, nworkers, max_faulty=2):
    """The fault schedule, a pure function of (seed, duration): a list of
    {"t", "kind", "worker", "dur", "params"}. Faults start every 2-5 s (times 2 / max_faulty)
    after a 3 s warm-up, each on a worker with no fault in force; at most `max_faulty` workers
    are faulty at once; the kinds come in shuffled rounds, so every kind runs once per round (the
    first round starts with kill, http500, stop, so even a short run has them); every fault ends
    by duration - 4 s."""
    rng = random.Random("faults-%d" % seed)
    busy = [0.0] * nworkers
    t = 3.0
    out = []
    bag = []
    end = duration - 4.0
    first = True
    while True:
        if not bag:
            bag = list(FAULT_KINDS)
            rng.shuffle(bag)
            if first:  # the first round starts with a kill, a 5xx spell and a stop
                bag = [k for k in bag if k not in ("kill", "http500", "stop")] + [
                    "stop", "http500", "kill"]
                first = False
        kind = bag.pop()
        params = {}
        if kind == "kill":
            dur = rng.uniform(1.0, 4.0)
        elif kind == "stop":
            dur = rng.uniform(2.0, 7.0)
        elif kind == "http500":
            dur = rng.uniform(3.0, 8.0)
            params = {"fail_rate": rng.choice([1.0, 1.0, 0.5]),
                      "fail_status": rng.choice([500, 500, 503])}
        elif kind == "stall":
            dur = rng.uniform(2.0, 5.0)
            params = {"stall_after_events": rng.choice([0, 1, 3, 10, 40])}
        elif kind == "drop":
            dur = rng.uniform(2.0, 5.0)
            params = {"drop_after_events": rng.choice([0, 1, 5, 20])}
        elif kind == "unhealthy":
            dur = rng.uniform(2.0, 5.0)
            params = {"health_status": 503}
        else:  # delay: some above kvroute's first-byte timeout
            dur = rng.uniform(2.0, 5.0)
            params = {"delay_ms": rng.choice([500, 1500, FIRST_BYTE_TIMEOUT_MS + 1500])}
        free = [i for i in range(nworkers) if busy[i] <= t]
        nbusy = nworkers - len(free)
        if not free or nbusy >= max_faulty:
            t = min(b for b in busy if b > t) + 0.5
        if t + dur > end:
            break
        free = [i for i in range(nworkers) if busy[i] <= t]
        w = rng.choice(free)
        dur = round(dur, 2)
        out.append({"t": round(t, 2), "kind": kind, "worker": w, "dur": dur, "params": params})
        busy[w] = t + dur + 1.0  # a second of calm on that worker before its next fault
        t += rng.uniform(2.0, 5.0) * 2 / max_faulty  # more faulty workers, denser faults
    return out


class FaultDriver:
    def __init__(self, sims, schedule, t0):
        self.sims = sims
        self.schedule = schedule
        self.t0 = t0
        self.stop = threading.Event()
        self.log = []  # applied actions
        self.errors = []
        self.counts = {}
        self.lock = threading.Lock()

    def note(self, what, sim, detail=""):
        e = {"t": round(time.monotonic() - self.t0, 2), "action": what, "worker": sim.name,
             "url": sim.url, "detail": detail}
        with self.lock:
            self.log.append(e)
        log("%6.1fs fault %-9s %s %s" % (e["t"], what, sim.name, detail))

    def begin(self, f):
        s = self.sims[f["worker"]]
        k = f["kind"]
        if k == "kill":
            s.proc.kill()
            s.down = True
            self.note("kill", s, "SIGKILL pid %d" % s.proc.pid)
        elif k == "stop":
            s.proc.sigstop()
            self.note("stop", s, "SIGSTOP pid %d" % s.proc.pid)
        else:
            ok = s.faults(**f["params"])
            self.note(k, s, json.dumps(f["params"]) + ("" if ok else " (POST /sim/faults failed)"))
            if not ok:
                self.errors.append("POST /sim/faults %s to %s failed" % (f["params"], s.name))
        with self.lock:
            self.counts[k] = self.counts.get(k, 0) + 1

    def end(self, f):
        s = self.sims[f["worker"]]
        k = f["kind"]
        if k == "kill":
            try:
                s.start()
                self.note("restart", s, "pid %d, same port" % s.proc.pid)
            except RuntimeError as e:
                self.errors.append(str(e))
                log("restart failed: %s" % e)
        elif k == "stop":
            s.proc.sigcont()
            self.note("cont", s, "SIGCONT pid %d" % s.proc.pid)
        else:
            undo = {"fail_rate": 0, "fail_status": 500, "delay_ms": 0,
                    "stall_after_events": -1, "drop_after_events": -1, "health_status": 200}
            ok = s.faults(**{key: undo[key] for key in f["params"]})
            self.note(k + "-end", s, "" if ok else "(POST /sim/faults failed)")
            if not ok:
                self.errors.append("undoing %s on %s failed" % (k, s.name))

    def run(self):
        pending = []  # (time, seq, "begin"/"end", fault)
        for i, f in enumerate(self.schedule):
            pending.append((f["t"], 2 * i, "begin", f))
            pending.append((f["t"] + f["dur"], 2 * i + 1, "end", f))
        pending.sort(key=lambda x: (x[0], x[1]))
        begun = set()
        try:
            for t, seq, what, f in pending:
                if what == "begin":
                    if self.stop.wait(max(0.0, self.t0 + t - time.monotonic())):
                        break
                    self.begin(f)
                    begun.add(id(f))
                else:
                    if self.stop.wait(max(0.0, self.t0 + t - time.monotonic())):
                        break
                    self.end(f)
                    begun.discard(id(f))
        finally:
            # Stopped early (or an error): undo whatever is still in force.
            for f in self.schedule:
                if id(f) in begun:
                    try:
                        self.end(f)
                    except Exception as e:  # noqa: BLE001
                        self.errors.append("undo %s: %r" % (f["kind"], e))


# ============================================================================ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    ap.add_argument("--concurrency", type=int, default=8, help="client sessions at once (default 8)")
    ap.add_argument("--seed", type=int, default=1, help="seeds the fault schedule, the request "
                    "mix, the sims and kvroute (default 1)")
    ap.add_argument("--build", default=str(ROOT / "build"),
                    help="directory holding kvroute and kvroute-sim (default build/)")
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT",
                    help="write the JSON summary to OUT (stdout when OUT is omitted or -)")
    ap.add_argument("--time-scale", type=float, default=0.2,
                    help="the sims' --time-scale (default 0.2: a 200-token answer takes ~0.3 s)")
    ap.add_argument("--max-tokens-cap", type=int, default=200, help="cap on max_tokens (default 200)")
    ap.add_argument("--think-ms", type=float, default=20.0,
                    help="mean think time between turns, ms (default 20)")
    ap.add_argument("--client-deadline", type=float, default=0,
                    help="seconds a request may take (default: kvroute's worst case + 15 s)")
    ap.add_argument("--max-faulty", type=int, default=2, choices=range(1, NWORKERS + 1),
                    help="workers under a fault at once, at most (default 2; 3-4 exhaust retries)")
    ap.add_argument("--kvroute-arg", action="append", default=[], help="extra kvroute flag (repeatable)")
    ap.add_argument("--kvroute-log-level", default="info")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--print-schedule", action="store_true", help="print the fault schedule and exit")
    args = ap.parse_args()
    if args.duration < 10 or args.concurrency < 1:
        ap.error("--duration must be at least 10 and --concurrency at least 1")

    schedule = make_schedule(args.seed, args.duration, NWORKERS, args.max_faulty)
    if args.print_schedule:
        json.dump(schedule, sys.stdout, indent=1)
        print()
        return 0
    build = Path(args.build).resolve()
    for b in ("kvroute", "kvroute-sim"):
        if not os.access(build / b, os.X_OK):
            log("%s is missing (run make)" % (build / b))
            return 2

    # The worst a request can legitimately take: every attempt connects slowly and times out
    # waiting for headers, then the stream stalls once.
    router_bound = ((MAX_RETRIES + 1) * (CONNECT_TIMEOUT_MS + FIRST_BYTE_TIMEOUT_MS)
                    + STREAM_IDLE_TIMEOUT_MS) / 1000.0
    deadline_s = args.client_deadline or router_bound + 15.0

    convs = load_trace(TRACE, args.max_tokens_cap)
    workdir = Path(tempfile.mkdtemp(prefix="kvroute-chaos."))
    sims = []
    kv = None
    replay = None
    driver = None
    threads = []
    checks = {}
    failures = []
    interrupted = []

    def on_signal(signum, _frame):
        interrupted.append(signum)
        if replay:
            replay.stop.set()
        if driver:
            driver.stop.set()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    summary = {}
    rc = 1
    try:
        ports = pick_ports(NWORKERS + 1)
        for i in range(NWORKERS):
            s = Sim(build, i, ports[i], args.seed * 100, workdir, args.time_scale)
            s.start()
            sims.append(s)
        extra = list(args.kvroute_arg)
        kv = Kvroute(build, ports[NWORKERS], sims, workdir, args.seed, extra, args.kvroute_log_level)
        kv.wait_ready()
        log("build %s, workdir %s, seed %d, %.0fs, concurrency %d, client deadline %.0fs, "
            "%d faults scheduled" % (build, workdir, args.seed, args.duration, args.concurrency,
                                     deadline_s, len(schedule)))
        log("kvroute pid %d on %s; workers %s" % (kv.pid, kv.url,
                                                 " ".join("%s=%s" % (s.name, s.url) for s in sims)))

        t0 = time.monotonic()
        replay = Replay(args, kv.url, convs, deadline_s, t0)
        driver = FaultDriver(sims, schedule, t0)
        dthread = threading.Thread(target=driver.run, name="faults", daemon=True)
        dthread.start()
        for i in range(args.concurrency):
            th = threading.Thread(target=replay.run_thread, args=(i,), name="client-%d" % i,
                                  daemon=True)
            th.start()
            threads.append(th)
        end = t0 + args.duration
        last_report = t0
        while time.monotonic() < end and not interrupted:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if time.monotonic() - last_report >= 15:
                last_report = time.monotonic()
                with replay.lock:
                    res = list(replay.results)
                log("%5.0fs requests=%d ok=%d failed_clean=%d lost=%d" % (
                    time.monotonic() - t0, len(res), sum(o.cls == "ok" for o in res),
                    sum(o.cls == "failed_clean" for o in res), sum(o.cls == "lost" for o in res)))
            if not kv.proc.alive():
                log("kvroute exited (%r) during the run" % kv.proc.returncode())
                break

        # ---- wind down: faults undone first (SIGCONT, restarts), then the clients finish.
        driver.stop.set()
        dthread.join(timeout=START_TIMEOUT_S * 2 + 10)
        checks["faults_undone"] = not dthread.is_alive() and all(
            s.proc.alive() and not s.proc.stopped for s in sims)
        replay.stop.set()
        join_deadline = time.monotonic() + 2 * deadline_s + 10
        for th in threads:
            th.join(timeout=max(0.1, join_deadline - time.monotonic()))
        stuck = [th.name for th in threads if th.is_alive()]
        checks["clients_finished"] = not stuck
        if stuck:
            failures.append("client threads still waiting after %.0fs: %s" % (2 * deadline_s + 10, stuck))
        t_load = time.monotonic() - t0

        # ---- in-flight gauges back to 0 (bounded)
        inflight = None
        if kv.proc.alive():
            qdeadline = time.monotonic() + 30
            while time.monotonic() < qdeadline:
                try:
                    inflight = metric_by(kv.metrics(), "kvroute_worker_inflight", "worker")
                    if inflight and all(v == 0 for v in inflight.values()):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        checks["inflight_zero"] = bool(inflight) and all(v == 0 for v in inflight.values())
        if not checks["inflight_zero"]:
            failures.append("kvroute_worker_inflight not 0 after 30 s: %r" % inflight)

        # ---- kvroute answers again once the faults stopped (bounded by more than the longest
        # breaker cooldown, 60 s, though it takes well under a second when all is well)
        recovered = False
        t_rec = time.monotonic()
        rdeadline = t_rec + 65
        c = httpx.Client()
        try:
            good = 0
            while time.monotonic() < rdeadline and kv.proc.alive():
                o = Outcome("chaos-recovery-%d" % good, "recovery", good, good % 2 == 1, 0)
                body = {"model": MODEL, "max_tokens": 8, "stream": good % 2 == 1,
                        "messages": [{"role": "user", "content": "recovery check %d" % good}]}
                do_request(c, kv.url + "/v1/chat/completions", body, o, 30.0)
                good = good + 1 if o.cls == "ok" else 0
                if good >= 8:
                    recovered = True
                    break
                if o.cls != "ok":
                    time.sleep(0.5)
        finally:
            c.close()
        checks["recovered"] = recovered
        recovery_s = round(time.monotonic() - t_rec, 2)
        if not recovered:
            failures.append("kvroute did not answer 8 requests in a row within 65 s after the faults")

        # ---- kvroute's own view
        samples = []
        try:
            samples = kv.metrics()
        except httpx.HTTPError as e:
            failures.append("GET /metrics failed at the end: %r" % e)
        same = kv.proc.alive() and kv.proc.pid == kv.pid
        checks["kvroute_same_process"] = same
        if not same:
            failures.append("kvroute pid %d is gone (exit %r)" % (kv.pid, kv.proc.returncode()))

        # ---- stop everything by pid; kvroute must exit 0 on SIGTERM
        krc = kv.proc.stop(timeout=DRAIN_TIMEOUT_S + 10)
        checks["kvroute_clean_exit"] = krc == 0
        if krc != 0:
            failures.append("kvroute exited %r after SIGTERM (want 0)" % krc)
        sim_rcs = []
        for s in sims:
            sim_rcs.append(s.proc.stop())
        ktext = kv.proc.text(since_start=False)
        kvsan = next((mk for mk in SANITIZER_MARKERS if mk in ktext), None)
        checks["kvroute_no_sanitizer_report"] = kvsan is None
        if kvsan:
            i = ktext.find(kvsan)
            failures.append("kvroute sanitizer report (%s):\n%s" % (kvsan, ktext[max(0, i - 300): i + 4000]))
        simsan = []
        for s in sims:
            t = s.proc.text(since_start=False)
            mk = next((m for m in SANITIZER_MARKERS if m in t), None)
            if mk:
                i = t.find(mk)
                simsan.append("%s: %s" % (s.name, t[max(0, i - 300): i + 3000]))
        checks["sims_no_sanitizer_report"] = not simsan
        if simsan:
            failures.append("kvroute-sim sanitizer report:\n" + "\n".join(simsan))
        checks["sims_clean_exit"] = all(r == 0 for r in sim_rcs)
        if not checks["sims_clean_exit"]:
            failures.append("kvroute-sim exit statuses after SIGTERM: %r (want 0)" % sim_rcs)
        if driver.errors:
            checks["fault_driver"] = False
            failures.extend("fault driver: " + e for e in driver.errors)
        else:
            checks["fault_driver"] = True

        # ---- the numbers
        res = list(replay.results)
        lost = [o for o in res if o.cls == "lost"]
        retried = sum(1 for o in res if o.attempts and o.attempts.isdigit() and int(o.attempts) > 1)
        attempts = [int(o.attempts) for o in res if o.attempts and o.attempts.isdigit()]
        checks["attempts_within_max_retries"] = all(1 <= a <= MAX_RETRIES + 1 for a in attempts)
        if not checks["attempts_within_max_retries"]:
            failures.append("x-kvroute-attempts outside 1..%d: %r" % (
                MAX_RETRIES + 1, sorted(set(attempts))))
        proxied = [o for o in res if o.status is not None and o.error_code != "no_eligible_worker"]
        checks["attempts_header_present"] = all(o.attempts for o in proxied)
        if not checks["attempts_header_present"]:
            failures.append("responses without x-kvroute-attempts: %s" % [
                (o.rid, o.status) for o in proxied if not o.attempts][:10])
        by_code, timeline = {}, {}
        for o in res:
            if o.cls == "failed_clean":
                k = "%s/%s" % (o.status, o.error_code)
                by_code[k] = by_code.get(k, 0) + 1
                sec = timeline.setdefault(str(int(o.t_start)), {})
                sec[k] = sec.get(k, 0) + 1
        for o in lost:  # evidence: kvroute's log lines naming the request
            o.why += "".join("\n    kvroute: " + ln for ln in ktext.splitlines() if o.rid in ln)
        lat = sorted(o.elapsed for o in res if o.elapsed is not None)
        summary = {
            "build": str(build), "seed": args.seed, "duration_s": args.duration,
            "load_s": round(t_load, 1), "concurrency": args.concurrency,
            "client_deadline_s": deadline_s,
            "kvroute_flags": {"connect_timeout_ms": CONNECT_TIMEOUT_MS,
                              "first_byte_timeout_ms": FIRST_BYTE_TIMEOUT_MS,
                              "stream_idle_timeout_ms": STREAM_IDLE_TIMEOUT_MS,
                              "max_retries": MAX_RETRIES,
                              "health_interval_ms": HEALTH_INTERVAL_MS},
            "requests": len(res),
            "streaming": sum(1 for o in res if o.stream),
            "ok": sum(1 for o in res if o.cls == "ok"),
            "retried": retried,
            "failed_clean": sum(1 for o in res if o.cls == "failed_clean"),
            "lost": len(lost),
            "failed_clean_by_status_code": by_code,
            "failed_clean_by_second": timeline,
            "latency_s": {"p50": round(lat[len(lat) // 2], 3) if lat else None,
                          "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3) if lat else None,
                          "max": round(lat[-1], 3) if lat else None},
            "faults": driver.counts,
            "faults_scheduled": len(schedule),
            "fault_log": driver.log,
            "kvroute_retries_total": metric_by(samples, "kvroute_retries_total", "reason"),
            "kvroute_upstream_errors_total": metric_by(samples, "kvroute_upstream_errors_total", "kind"),
            "kvroute_breaker_transitions_total": metric_by(samples, "kvroute_breaker_transitions_total", "state"),
            "kvroute_requests_total": metric_by(samples, "kvroute_requests_total", "code"),
            "worker_restarts": sum(len(s.procs) - 1 for s in sims),
            "recovery_s": recovery_s,
            "checks": checks,
            "failures": failures,
            "lost_requests": [o.as_dict() | {"why": o.why} for o in lost[:50]],
            "workdir": str(workdir),
        }
        if interrupted:
            failures.append("interrupted by signal %d" % interrupted[0])
        passed = not lost and not failures and all(checks.values())
        summary["pass"] = passed
        rc = 0 if passed else 1
    except Exception as e:  # noqa: BLE001 - report and stop everything
        log("error: %r" % e)
        failures.append("error: %r" % e)
        summary.setdefault("failures", failures)
        summary["pass"] = False
        rc = 2 if not summary.get("requests") else 1
    finally:
        if replay:
            replay.stop.set()
        if driver:
            driver.stop.set()
        for s in sims:  # never leave a worker stopped
            for p in s.procs:
                p.stop()
        if kv:
            kv.proc.stop()

    for o_ in summary.get("lost_requests", []):
        log("lost: %s" % json.dumps(o_))
    for f in failures:
        log("FAILED: %s" % f)
    if "requests" in summary:
        print("chaos: %s seed=%d duration=%.0fs requests=%d ok=%d retried=%d failed_clean=%d "
              "lost=%d faults=%s checks=%s" % (
                  "PASS" if summary["pass"] else "FAIL", args.seed, args.duration,
                  summary["requests"], summary["ok"], summary["retried"],
                  summary["failed_clean"], summary["lost"],
                  ",".join("%s:%d" % kv_ for kv_ in sorted(summary["faults"].items())),
                  ",".join(k for k, v in checks.items() if not v) or "all-ok"))
        sys.stdout.flush()
    if args.json:
        text = json.dumps(summary, indent=1, sort_keys=True)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if rc == 0 and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log("logs kept in %s" % workdir)
    return rc


if __name__ == "__main__":
    sys.exit(main())
