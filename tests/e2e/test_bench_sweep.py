"""kvroute-bench rate sweeps (issue 16) against kvroute-sim: rates reported in order, ordered
percentiles, model time (a saturated sim shows a TTFT p90 far above the lowest rate's and a lower
goodput; far below saturation most requests meet the SLO), the JSON shape, bad flags, and
compare.sh --sweep writing its two PNGs. Mechanics and model-time sanity only, never wall-clock
thresholds. Every process is started on 127.0.0.1 and stopped by pid; every wait is bounded.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bench import tau_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KVROUTE_BUILD", str(REPO / "build")))
BENCH, SIM = BUILD / "kvroute-bench", BUILD / "kvroute-sim"

pytestmark = pytest.mark.skipif(not (BENCH.exists() and SIM.exists()), reason="not built")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def sim():
    procs = []

    def start(*args):
        port = free_port()
        p = subprocess.Popen([str(SIM), "--port", str(port), "--model", "m", *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("kvroute-sim did not start")

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def bench(*args, timeout=120):
    return subprocess.run([str(BENCH), "--progress", "none", "--model", "m", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_sweep_shape_order_and_saturation(sim, tmp_path):
    # One slow worker (a 4-token prefill costs 10 ms of model time, two sequences at most) at
    # time scale 0.1: 4 sessions per model second are far below what it serves, 60 far above.
    # (At 0.02 a millisecond of wall-clock delay, common under ASan on a busy machine, counts
    # as 50 ms of model time and pushed the low rate's TTFTs past the SLO.)
    url = sim("--time-scale", "0.1", "--max-num-seqs", "2", "--prefill-us-per-token", "400")
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=6, turns=2)
    out = tmp_path / "out.json"
    r = bench("--url", url, "--trace", str(trace), "--format", "tau", "--sweep", "4,60",
              "--sweep-duration", "3", "--think-ms", "100", "--time-scale", "0.1",
              "--max-tokens-cap", "8", "--slo-ttft-ms", "500", "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    sw = j["sweep"]
    assert [p["offered_rate"] for p in sw] == [4, 60]
    for p in sw:
        assert set(p) >= {"offered_rate", "achieved_rps", "ttft_s", "itl_s", "e2e_s",
                          "output_tps", "goodput", "errors", "workers"}
        assert set(p["ttft_s"]) == {"p50", "p90", "p99"} and set(p["itl_s"]) == {"p50", "p90"}
        assert set(p["e2e_s"]) == {"p50", "p99"}
        assert p["errors"] == 0 and p["requests"] == p["ok"] > 0
        t = p["ttft_s"]
        assert t["p50"] <= t["p90"] <= t["p99"]
        assert p["itl_s"]["p50"] <= p["itl_s"]["p90"] and p["e2e_s"]["p50"] <= p["e2e_s"]["p99"]
        assert 0 <= p["goodput"] <= 1
        w = p["workers"][url]
        assert w["requests"] == p["requests"] and 0 < w["busy_share"] <= 1.0001
    low, high = sw
    assert low["goodput"] >= 0.5  # far below saturation
    assert high["ttft_s"]["p90"] > 1.5 * low["ttft_s"]["p90"]
    assert high["goodput"] < low["goodput"]
    # Model time: a request's TTFT includes at least its prefill (≥ 10 ms of model time), far
    # more than the wall time it took at scale 0.1 would suggest if unscaled.
    assert low["ttft_s"]["p50"] >= 0.01
    # Today's fields still there, covering both passes.
    assert j["requests"] == low["requests"] + high["requests"] and j["goodput"] is not None
    assert j["config"]["mode"] == "sweep" and j["config"]["slo_ttft_ms"] == 500
    assert "sweep (times in model ms" in r.stdout


def test_sweep_auto_finds_a_saturation_rate(sim, tmp_path):
    url = sim("--time-scale", "0.02", "--max-num-seqs", "2", "--prefill-us-per-token", "400")
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=4, turns=2)
    out = tmp_path / "out.json"
    r = bench("--url", url, "--trace", str(trace), "--format", "tau", "--sweep-auto",
              "--sweep-duration", "2", "--sweep-start", "8", "--sweep-points", "3",
              "--sweep-max-probes", "5", "--think-ms", "100", "--time-scale", "0.02",
              "--max-tokens-cap", "8", "--slo-ttft-ms", "500", "--json", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    sat = j["sweep_auto"]["saturation_rate"]
    ramp = j["sweep_auto"]["ramp"]
    assert 2 <= len(ramp) <= 5
    if sat is not None:
        rates = [p["offered_rate"] for p in j["sweep"]]
        assert rates == sorted(rates) and len(rates) == 3
        assert rates[0] == pytest.approx(0.1 * sat) and rates[-1] == pytest.approx(1.2 * sat)


@pytest.mark.parametrize("args,msg", [
    (["--sweep", "1,-2"], "bad value"),
    (["--sweep", "1,,2"], "bad value"),
    (["--sweep", "abc"], "bad value"),
    (["--sweep", "1", "--rate", "2"], "one of"),
    (["--sweep-auto", "--concurrency", "2"], "one of"),
    (["--sweep", "1", "--sweep-duration", "0"], "bad value"),
    (["--sweep-auto", "--sweep-points", "1"], "bad value"),
    (["--sweep", "1", "--slo-ttft-ms", "x"], "bad value"),
    (["--sweep", "1", "--slo-itl-ms", "-1"], "bad value"),
])
def test_sweep_bad_arguments(tmp_path, args, msg):
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=1, turns=1)
    r = bench("--url", "http://127.0.0.1:1", "--trace", str(trace), "--format", "tau", *args)
    assert r.returncode == 2
    assert msg in r.stderr


COMPARE = REPO / "scripts" / "compare.sh"


@pytest.mark.skipif(not (BUILD / "kvroute").exists(), reason="kvroute not built")
def test_compare_sweep_writes_pngs_and_json(tmp_path):
    trace = tau_trace(tmp_path / "tau.jsonl", conversations=4, turns=2)
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    env = dict(os.environ, KVROUTE_BUILD=str(BUILD))
    r = subprocess.run(["bash", str(COMPARE), "--trace", str(trace), "--format", "tau",
                        "--json", str(out), "--png", str(png), "--workers", "2",
                        "--policies", "round_robin,cache_aware", "--sweep", "2,20",
                        "--sweep-duration", "2", "--think-ms", "100", "--time-scale", "0.02",
                        "--sim-args", "--max-num-seqs 2 --prefill-us-per-token 400",
                        "--bench-arg", "--max-tokens-cap=8", "--replay-timeout", "60"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    for row in [j["bound"], *j["policies"].values()]:
        assert [p["offered_rate"] for p in row["sweep"]] == [2, 20]
    assert set(j["sweep_summary"]["policies"]) == {"pooled bound", "round_robin", "cache_aware"}
    assert "max rate @SLO" in r.stdout
    import shutil
    if shutil.which("gnuplot"):
        for suffix in ("-ttft.png", "-goodput.png"):
            f = tmp_path / ("cmp" + suffix)
            assert f.exists() and f.read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run(["bash", str(COMPARE), "--trace", str(trace), "--format", "tau",
                          "--json", str(out), "--sweep", "1,x"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2
