"""End-to-end tests of kvroute-sim's timing profiles (`--profile`, docs/sim.md "Timing
profiles"): real processes on 127.0.0.1, every wait bounded.

Times are checked in model time (what the GPU would show), never against wall-clock
thresholds: the sim reports each non-streaming request's model TTFT and end-to-end time in the
`x-sim-model-ttft-ms` / `x-sim-model-e2e-ms` headers, and its model clock in /sim/stats. The
time scale (0.02) keeps a test fast (a 2,000-token 70B prefill is ~4 ms of wall time) while
the model-time figures do not depend on how loaded the machine is.
"""

import subprocess
import threading

import httpx

from conftest import SIM_BIN, SIM_MODEL as MODEL  # the sim_factory fixture: conftest.py

P8 = "h100-llama3.1-8b"
P70 = "h100x4-llama3.1-70b"
SCALE = "0.02"


def complete_ids(sim, ids, max_tokens=2):
    """A non-streaming /v1/completions of prompt token ids; returns (usage, headers)."""
    r = sim.client.post("/v1/completions",
                        json={"model": MODEL, "prompt": ids, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()["usage"], r.headers


def model_ttft_ms(headers):
    return float(headers["x-sim-model-ttft-ms"])


def test_idle_ttft_of_2000_tokens_is_sane_and_70b_slower(sim_factory):
    ttft = {}
    for profile in (P8, P70):
        sim = sim_factory("--profile", profile, "--time-scale", SCALE)
        usage, h = complete_ids(sim, list(range(1000, 3000)))
        assert usage["prompt_tokens"] == 2000 and usage["prompt_tokens_details"]["cached_tokens"] == 0
        ttft[profile] = model_ttft_ms(h)
        # the first token ends the one prefill step; the e2e adds one decode step
        assert float(h["x-sim-model-e2e-ms"]) > ttft[profile]
        assert h["x-sim-preemptions"] == "0"
        st = sim.stats()
        assert st["engine"]["profile"] == profile
        assert st["steps"] == 2
        assert abs(st["model_us"] / 1e3 - float(h["x-sim-model-e2e-ms"])) < 0.01
    assert 20 <= ttft[P8] <= 1000, ttft
    assert 20 <= ttft[P70] <= 1000, ttft
    assert ttft[P8] < ttft[P70], ttft


def test_cache_hit_shortens_model_ttft(sim_factory):
    sim = sim_factory("--profile", P8, "--time-scale", SCALE)
    ids = list(range(5000, 7000))
    _, cold = complete_ids(sim, ids)
    usage, warm = complete_ids(sim, ids)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 1984
    # 16 tokens left to prefill: little more than the step overhead (6 ms)
    assert model_ttft_ms(warm) < model_ttft_ms(cold) / 5
    assert 6.0 <= model_ttft_ms(warm) < 8.0


def test_flags_override_the_profile_wherever_given(sim_factory):
    sim = sim_factory("--kv-blocks", "512", "--prefill-us-per-token", "50", "--profile", P8,
                      "--max-num-batched-tokens", "1024", "--time-scale", SCALE)
    st = sim.stats()
    eng = st["engine"]
    assert st["kv_blocks"] == 512                  # given before --profile
    assert eng["prefill_us_per_token"] == 50       # given before --profile
    assert eng["max_num_batched_tokens"] == 1024   # given after --profile
    assert eng["profile"] == P8
    assert eng["max_num_seqs"] == 1024             # from the profile
    assert eng["step_overhead_us"] == 6000
    assert abs(eng["decode_us_per_kv_token"] - 0.049) < 1e-9
    assert eng["max_model_len"] == 131072
    # the model name given (conftest's --model) wins over the profile's
    assert sim.client.get("/v1/models").json()["data"][0]["id"] == MODEL
    # 2,000 tokens in chunks of 1,024: two steps of 6 ms + 2,000 × 50 µs
    _, h = complete_ids(sim, list(range(9000, 11000)))
    assert abs(model_ttft_ms(h) - (2 * 6.0 + 2000 * 0.050)) < 0.01


def test_small_kv_preempts_and_everything_completes(sim_factory):
    # 6 requests of 96 prompt tokens (6 blocks) + 160 output tokens (10 more blocks) over 40
    # blocks: all fit at admission, and any 3 running together run out of blocks while
    # decoding (a request runs ~160 steps, ~0.5 s of wall time at this scale, so they overlap
    # even when a loaded machine staggers the six clients' starts: at 0.05, ~50 ms each, a CI
    # rehearsal once saw them run one after another and no preemption).
    sim = sim_factory("--profile", P8, "--kv-blocks", "40", "--time-scale", "0.5")
    results, errors = [None] * 6, []
    start = threading.Barrier(6, timeout=10)

    def one(i):
        try:
            start.wait()
            with httpx.Client(base_url=sim.url, timeout=30.0) as c:
                ids = [20000 + 1000 * i + k for k in range(96)]
                r = c.post("/v1/completions",
                           json={"model": MODEL, "prompt": ids, "max_tokens": 160})
                results[i] = (r.status_code, r.json(), r.headers)
        except Exception as e:  # surfaced below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "requests did not finish"
    assert not errors, errors
    preempted = 0
    for status, body, h in results:
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 160
        preempted += int(h["x-sim-preemptions"])
    st = sim.stats()
    assert st["preemptions"] >= 1, st
    assert preempted == st["preemptions"]
    assert st["running"] == 0 and st["waiting"] == 0 and st["kv_blocks_used"] == 0
    m = sim.metrics()
    assert m.get("vllm:num_preemptions_total", model_name=MODEL) == st["preemptions"]


def test_unknown_profile_is_a_clear_error_with_status_2():
    p = subprocess.run([str(SIM_BIN), "--port", "0", "--profile", "a100-gpt5"],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2
    assert "unknown profile 'a100-gpt5'" in p.stderr
    assert P8 in p.stderr and P70 in p.stderr


def test_help_lists_the_profiles():
    p = subprocess.run([str(SIM_BIN), "--help"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0
    assert "--profile" in p.stdout
    assert P8 in p.stdout and P70 in p.stdout
