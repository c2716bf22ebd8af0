"""End-to-end tests of kvroute-sim for data-parallel and disaggregated (prefill/decode) fleets
(issue 21, docs/sim.md): real sims on 127.0.0.1 driven directly over HTTP, every wait bounded.

Data parallelism: --data-parallel-size N ranks behind one port, chosen by X-data-parallel-rank
(round robin without it), each with its own --kv-blocks cache, metrics series engine="r" and
KV events carrying data_parallel_rank.
"""

import json
import time

import msgpack
import pytest
import zmq

from conftest import SIM_MODEL as MODEL
from conftest import assert_openai_error, free_port

SYSTEM = {"role": "system", "content": "You answer questions about caches briefly. " * 6}


def ask(sim, text, rank=None, max_tokens=4, **extra):
    headers = {} if rank is None else {"X-data-parallel-rank": str(rank)}
    body = {"model": MODEL, "max_tokens": max_tokens,
            "messages": [SYSTEM, {"role": "user", "content": text}], **extra}
    r = sim.client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def cached(resp):
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


# ---- data parallelism

def test_dp_ranks_have_separate_caches(sim_factory):
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "2", "--kv-blocks", "300")
    first = ask(sim, "What is a block?", rank=0)
    assert cached(first) == 0
    again = ask(sim, "What is a block?", rank=0)
    assert cached(again) >= first["usage"]["prompt_tokens"] - 16 > 0
    # the other rank has never seen the prompt: its own cache is cold
    other = ask(sim, "What is a block?", rank=1)
    assert cached(other) == 0
    assert cached(ask(sim, "What is a block?", rank=1)) == cached(again)
    st = sim.stats()
    assert st["data_parallel_size"] == 2
    assert [r["kv_blocks"] for r in st["ranks"]] == [300, 300]
    assert st["kv_blocks"] == 600
    assert [r["prefix_cache_hits"] for r in st["ranks"]] == [cached(again), cached(again)]


def test_dp_round_robin_without_header(sim_factory):
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "3")
    got = [cached(ask(sim, "Round robin question")) for _ in range(6)]
    # ranks 0, 1, 2 each see it cold once, then warm
    assert got[:3] == [0, 0, 0]
    assert min(got[3:]) > 0
    assert [r["prefix_cache_queries"] > 0 for r in sim.stats()["ranks"]] == [True] * 3


@pytest.mark.parametrize("value", ["2", "-1", "abc", "1.5", ""])
def test_dp_bad_rank_header_is_a_400(sim_factory, value):
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "2")
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = sim.client.post("/v1/chat/completions", json=body,
                        headers={"X-data-parallel-rank": value})
    assert_openai_error(r, 400)
    assert "X-data-parallel-rank" in r.json()["error"]["message"]
    # the sim still serves
    assert ask(sim, "still fine", rank=1)["usage"]["completion_tokens"] == 4


def test_dp_metrics_carry_engine_label(sim_factory):
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "2")
    ask(sim, "metrics question", rank=1)
    ask(sim, "metrics question", rank=1)
    m = sim.metrics()
    hits1 = m.get("vllm:prefix_cache_hits_total", engine="1", model_name=MODEL)
    hits0 = m.get("vllm:prefix_cache_hits_total", engine="0", model_name=MODEL)
    assert hits1 > 0 and hits0 == 0
    assert m.get("vllm:request_success_total", engine="1", finished_reason="length") == 2
    assert m.get("vllm:request_success_total", engine="0", finished_reason="length") == 0
    for engine in ("0", "1"):
        assert m.find("vllm:cache_config_info", engine=engine)
        assert m.find("vllm:num_requests_running", engine=engine)


def free_port_pair():
    """A free port whose successor was free a moment ago too (rank 1 publishes on port + 1)."""
    import socket
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


def _subscriber(ctx, endpoint):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _stored_batches(sock, want, timeout=5.0):
    """Batches (seq, payload) until `want` BlockStored-carrying batches arrived or timeout."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        if sock.poll(50):
            topic, seq, payload = sock.recv_multipart()
            got.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
    return got


def _warm_up_sub(sim, socks, rank_of):
    """PUB/SUB slow joiner: sends throw-away requests until every socket has seen a batch."""
    deadline = time.monotonic() + 5
    seen = set()
    i = 0
    while len(seen) < len(socks) and time.monotonic() < deadline:
        for k, s in enumerate(socks):
            if k in seen:
                continue
            ask(sim, ("warm-up %d " % i) * 20, rank=rank_of(k), max_tokens=1)
            i += 1
            if s.poll(100):
                while s.poll(20):
                    s.recv_multipart()
                seen.add(k)
    assert len(seen) == len(socks), "no KV events arrived"


def test_dp_kv_events_per_rank_endpoints(sim_factory):
    port = free_port_pair()
    ep = "tcp://127.0.0.1:%d" % port
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "2",
                      "--kv-events-endpoint", "tcp://*:%d" % port)
    ctx = zmq.Context()
    try:
        socks = [_subscriber(ctx, ep), _subscriber(ctx, "tcp://127.0.0.1:%d" % (port + 1))]
        _warm_up_sub(sim, socks, lambda k: k)
        ask(sim, "events for rank one " * 20, rank=1, max_tokens=1)
        got = _stored_batches(socks[1], 1)
        assert got and all(p[2] == 1 for _, p in got)
        assert any(ev[0] == "BlockStored" for _, p in got for ev in p[1])
        assert not socks[0].poll(200)  # rank 0 computed nothing
        ask(sim, "events for rank zero " * 20, rank=0, max_tokens=1)
        got0 = _stored_batches(socks[0], 1)
        assert got0 and all(p[2] == 0 for _, p in got0)
    finally:
        ctx.destroy(linger=0)


def test_dp_kv_events_shared_endpoint(sim_factory):
    port = free_port()
    sim = sim_factory("--time-scale", "0", "--data-parallel-size", "2", "--kv-events-dp",
                      "shared", "--kv-events-endpoint", "tcp://*:%d" % port,
                      "--kv-events-format", "map")
    ctx = zmq.Context()
    try:
        sock = _subscriber(ctx, "tcp://127.0.0.1:%d" % port)
        _warm_up_sub(sim, [sock], lambda k: 0)
        ask(sim, "shared endpoint rank one " * 20, rank=1, max_tokens=1)
        ask(sim, "shared endpoint rank zero " * 20, rank=0, max_tokens=1)
        got = _stored_batches(sock, 2)
        assert sorted(p[2] for _, p in got) == [0, 1]
        seqs = [s for s, _ in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == 2  # one sequence for both ranks
        assert all(ev["type"] == "BlockStored" for _, p in got for ev in p[1])
    finally:
        ctx.destroy(linger=0)


def test_dp_offset_impossible_endpoint_fails_at_start(tmp_path):
    import subprocess
    from conftest import SIM_BIN
    r = subprocess.run([str(SIM_BIN), "--port", "0", "--data-parallel-size", "2",
                        "--kv-events-endpoint", "tcp://127.0.0.1:65535"],
                       capture_output=True, timeout=10)
    assert r.returncode == 1
    assert b"rank 1" in r.stderr
