"""kvroute-bench end to end: replays small traces against tests/bench/stub_worker.py (a python
streaming worker with a prefix cache) and checks what a user reads in the table and the JSON:
request and error counts, hit rate equal to the worker's own counters, the share of sessions
sent with x-session-id, per-worker counts, and clean refusals of bad arguments.

Every process is started on 127.0.0.1 and stopped by pid; every wait is bounded.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KVROUTE_BUILD", str(REPO / "build")))
BENCH = BUILD / "kvroute-bench"
STUB = REPO / "tests" / "bench" / "stub_worker.py"
PY = sys.executable or "/usr/bin/python3"

pytestmark = pytest.mark.skipif(not BENCH.exists(), reason="kvroute-bench not built")


@pytest.fixture
def stub(request):
    """Starts stub workers: stub(*args) -> base URL. All are stopped at teardown."""
    procs = []

    def start(*args):
        p = subprocess.Popen([PY, str(STUB), "--port", "0", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        procs.append(p)
        deadline = time.monotonic() + 10
        line = ""
        while time.monotonic() < deadline and not line:
            line = p.stdout.readline()
        m = re.match(r"listening (\d+)", line or "")
        assert m, "stub worker did not start"
        return "http://127.0.0.1:%s" % m.group(1)

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def metrics(url):
    text = httpx.get(url + "/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def bench(*args, timeout=60):
    return subprocess.run([str(BENCH), "--progress", "none", *args], capture_output=True,
                          text=True, timeout=timeout)


def tau_trace(path, conversations=6, turns=3):
    """A tau-bench-shaped trace: a shared system prompt, then user/assistant turns."""
    with open(path, "w") as f:
        for c in range(conversations):
            msgs = [{"role": "system", "content": "You are an airline agent. " * 40}]
            for t in range(turns):
                msgs.append({"role": "user", "content": "conversation %d question %d" % (c, t)})
                msgs.append({"role": "assistant", "content": "answer %d to %d " % (t, c) * 8})
            f.write(json.dumps({"task_id": c, "trial": 0, "reward": 1, "messages": msgs}) + "\n")
    return path


def test_replay_reports_what_the_worker_saw(stub, tmp_path):
    url = stub("--worker-header", "http://w1")
    trace = tau_trace(tmp_path / "tau.jsonl")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--trace", str(trace), "--format", "tau", "--concurrency", "3",
              "--think-ms", "5", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "hit rate" in r.stdout and "TTFT p50/p90/p99" in r.stdout
    j = json.loads(out.read_text())
    m = metrics(url)
    assert j["requests"] == j["ok"] == 18 and j["errors"] == 0
    assert m["stub_requests_total"] == 18
    # Hit rate and token sums come from the responses' usage: equal to the worker's counters.
    assert j["prompt_tokens"] == m["vllm:prefix_cache_queries_total"]
    assert j["cached_tokens"] == m["vllm:prefix_cache_hits_total"]
    assert j["hit_rate"] == pytest.approx(j["cached_tokens"] / j["prompt_tokens"])
    assert j["hit_rate"] > 0.5  # shared system prompt + append-only growth
    # Half the sessions (3 of 6, all their turns) carried x-session-id.
    assert j["session_header_requests"] == m["stub_session_header_requests_total"] == 9
    assert j["workers"]["http://w1"]["requests"] == 18
    assert 1 <= j["workers"]["http://w1"]["max_inflight"] <= 3
    assert j["decisions"] == {"stub": 18}
    assert j["ttft_s"]["p50"] is not None and j["ttft_s"]["p50"] <= j["e2e_s"]["p99"]


@pytest.mark.parametrize("spread", ["round_robin", "random"])
def test_several_urls_share_the_requests_per_request(stub, tmp_path, spread):
    """--url repeated (router replicas behind a balancer): every request goes to one of them,
    per request (a session's turns move), in round robin or at random."""
    urls = [stub(), stub(), stub()]
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=10, turns=3)
    out = tmp_path / "out.json"
    args = []
    for u in urls:
        args += ["--url", u]
    r = bench(*args, "--spread", spread, "--trace", str(trace), "--format", "tau",
              "--concurrency", "1", "--think-ms", "0", "--session-header-share", "0",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["requests"] == j["ok"] == 30
    counts = [metrics(u)["stub_requests_total"] for u in urls]
    assert sum(counts) == 30
    if spread == "round_robin":
        assert counts == [10, 10, 10], counts
    else:
        assert all(c >= 3 for c in counts), counts
    assert [j["workers"][u]["requests"] for u in urls] == counts
    assert j["config"]["urls"] == urls and j["config"]["spread"] == spread


def test_without_router_the_url_is_the_worker(stub, tmp_path):
    url = stub()
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=2, turns=2)
    out = tmp_path / "out.json"
    r = bench("--url", url, "--trace", str(trace), "--format", "tau", "--think-ms", "0",
              "--session-header-share", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert list(j["workers"]) == [url]
    assert j["session_header_requests"] == 0
    assert j["decisions"] == {}


def test_errors_are_counted_by_kind(stub, tmp_path):
    url = stub("--fail-every", "3")
    trace = tmp_path / "mc.jsonl"
    with open(trace, "w") as f:
        for i in range(9):
            f.write(json.dumps({"timestamp": i * 10, "input_length": 600, "output_length": 4,
                                "hash_ids": [0, 100 + i]}) + "\n")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--trace", str(trace), "--format", "mooncake", "--timestamps",
              "--time-scale", "0.1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["requests"] == 9 and j["errors"] == 3 and j["ok"] == 6
    assert j["errors_by_kind"] == {"http_503": 3}
    assert "first http_503 error" in r.stderr and "injected failure" in r.stderr
    assert j["session_header_requests"] == 0  # request traces have no sessions


def test_unreachable_url_is_an_error_not_a_crash(tmp_path):
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=2, turns=1)
    out = tmp_path / "out.json"
    r = bench("--url", "http://127.0.0.1:1", "--model", "m", "--trace", str(trace), "--format",
              "tau", "--think-ms", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["errors_by_kind"] == {"connect": 2}
    assert j["hit_rate"] is None


@pytest.mark.parametrize("args,code,msg", [
    ([], 2, "required"),
    (["--format", "csv"], 2, "unknown --format"),
    (["--format", "tau", "--timestamps"], 2, "no timestamps"),
    (["--format", "tau", "--concurrency", "0"], 2, "bad value"),
    (["--format", "tau", "--session-header-share", "2"], 2, "bad value"),
    (["--format", "tau", "--rate", "1", "--concurrency", "2"], 2, "one of"),
])
def test_bad_arguments(tmp_path, args, code, msg):
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=1, turns=1)
    base = [] if not args else ["--url", "http://127.0.0.1:1", "--model", "m", "--trace", str(trace)]
    r = bench(*base, *args)
    assert r.returncode == code
    assert msg in r.stderr


def test_bypass_share_sends_requests_straight_to_workers(stub, tmp_path):
    """--bypass-share: that share of requests skips --url for a --bypass-worker, chosen per
    request by the seed; they count in the totals and under the worker they reached."""
    router = stub("--worker-header", "http://router-picked")
    w1, w2 = stub(), stub()
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=10, turns=4)
    out, rec = tmp_path / "out.json", tmp_path / "rec.jsonl"
    args = ("--url", router, "--trace", str(trace), "--format", "tau", "--concurrency", "4",
            "--think-ms", "0", "--bypass-share", "0.5", "--bypass-worker", w1,
            "--bypass-worker", w2 + "/", "--json", str(out), "--records", str(rec))
    r = bench(*args)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    n1, n2 = metrics(w1)["stub_requests_total"], metrics(w2)["stub_requests_total"]
    nr = metrics(router)["stub_requests_total"]
    assert j["requests"] == j["ok"] == 40 and nr + n1 + n2 == 40
    assert j["bypassed_requests"] == n1 + n2 and 8 <= n1 + n2 <= 32 and n1 > 0 and n2 > 0
    assert j["workers"][w1]["requests"] == n1 and j["workers"][w2 + "/"]["requests"] == n2
    assert j["workers"]["http://router-picked"]["requests"] == nr
    assert j["decisions"] == {"stub": nr}  # bypassed answers carry no router decision
    assert "bypassed the router" in r.stdout and "hit rate by path" in r.stdout
    recs = [json.loads(line) for line in rec.read_text().splitlines()]
    assert sum(x["bypassed"] for x in recs) == n1 + n2
    assert j["config"]["bypass_share"] == 0.5 and j["config"]["bypass_workers"] == [w1, w2 + "/"]
    # The split of usage sums adds up to the totals.
    assert 0 <= j["bypassed_prompt_tokens"] <= j["prompt_tokens"]
    assert j["routed_hit_rate"] is not None and j["bypassed_hit_rate"] is not None
    # Same seed, same requests bypassed to the same workers.
    out2, rec2 = tmp_path / "out2.json", tmp_path / "rec2.jsonl"
    r = bench(*args[:-4], "--json", str(out2), "--records", str(rec2))
    assert r.returncode == 0, r.stderr
    again = {(x["session"], x["turn"]): x["worker"] for x in map(json.loads, rec2.read_text().splitlines())}
    assert again == {(x["session"], x["turn"]): x["worker"] for x in recs}


@pytest.mark.parametrize("args,msg", [
    (["--bypass-share", "0.5"], "needs at least one --bypass-worker"),
    (["--bypass-share", "1.5", "--bypass-worker", "http://127.0.0.1:1"], "bad value"),
    (["--bypass-share", "0.5", "--bypass-worker", "127.0.0.1:1"], "bad value"),
])
def test_bypass_bad_arguments(tmp_path, args, msg):
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=1, turns=1)
    r = bench("--url", "http://127.0.0.1:1", "--model", "m", "--trace", str(trace), "--format",
              "tau", *args)
    assert r.returncode == 2
    assert msg in r.stderr


COMPARE = REPO / "scripts" / "compare.sh"


@pytest.mark.skipif(not ((BUILD / "kvroute").exists() and (BUILD / "kvroute-sim").exists()),
                    reason="kvroute or kvroute-sim not built")
def test_compare_bypass_all_skips_kvroute(tmp_path):
    """compare.sh --bypass-share 1 with precise: every request reaches a sim directly, kvroute
    answers none (its kvroute_requests_total stays 0) yet the sims served and cached them; the
    workers' KV events reached kvroute (trust exact) though it routed nothing."""
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=4, turns=3)
    out = tmp_path / "cmp.json"
    env = dict(os.environ, KVROUTE_BUILD=str(BUILD))
    r = subprocess.run(["bash", str(COMPARE), "--trace", str(trace), "--format", "tau",
                        "--json", str(out), "--workers", "2", "--policies", "precise",
                        "--no-bound", "--think-ms", "0", "--bypass-share", "1",
                        "--concurrency", "2",
                        "--replay-timeout", "30"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    row = json.loads(out.read_text())["policies"]["precise"]
    assert row["requests"] == 12 and row["errors"] == 0
    assert row["bypassed_requests"] == 12 and row["router_requests"] == 0
    assert row["decisions"] == {} and row["predictions"] == 0
    assert row["prompt_tokens"] > 0 and row["cached_tokens"] > 0  # the sims' own counters
    assert sum(row["worker_requests"].values()) == 12
    assert set(row["kv_events_state"].values()) <= {"exact", "degraded"}
    assert "12 requests bypassed kvroute" in r.stdout
    bad = subprocess.run(["bash", str(COMPARE), "--trace", str(trace), "--format", "tau",
                          "--json", str(out), "--bypass-share", "2"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "--bypass-share" in bad.stderr


def test_missing_trace_file(tmp_path):
    r = bench("--url", "http://127.0.0.1:1", "--model", "m", "--trace", str(tmp_path / "nope"),
              "--format", "tau")
    assert r.returncode == 1
    assert "cannot open" in r.stderr
