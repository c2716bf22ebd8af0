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


# ---- prefill/decode: vLLM's NixlConnector (sequential)

LONG = "Explain how a disaggregated prefill and decode fleet moves the KV cache. " * 12

PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None,
                  "remote_host": None, "remote_port": None}


def chat_req(text=LONG, max_tokens=8, **extra):
    return {"model": MODEL, "max_tokens": max_tokens,
            "messages": [SYSTEM, {"role": "user", "content": text}], **extra}


def post(sim, body, rid=None, headers=None):
    h = dict(headers or {})
    if rid:
        h["X-Request-Id"] = rid
    return sim.client.post("/v1/chat/completions", json=body, headers=h)


def prefill_then(prefill, rid="pd-1", text=LONG):
    """The router's first call: the request with stream false, max_tokens 1 and the prefill
    kv_transfer_params; returns the prefill's answer."""
    body = chat_req(text, max_tokens=1, stream=False, kv_transfer_params=PREFILL_PARAMS)
    r = post(prefill, body, rid)
    assert r.status_code == 200, r.text
    return r.json()


def requests_log(sim):
    r = sim.client.get("/sim/requests")
    assert r.status_code == 200
    return r.json()


def metric(sim, name, **labels):
    return sim.metrics().get(name, **labels)


@pytest.fixture
def pd_pair(sim_factory):
    prefill = sim_factory("--time-scale", "0", "--role", "prefill")
    decode = sim_factory("--time-scale", "0", "--role", "decode")
    return prefill, decode


def test_nixl_prefill_answers_params_and_holds_blocks(pd_pair):
    prefill, _ = pd_pair
    ans = prefill_then(prefill)
    p = ans["kv_transfer_params"]
    n = ans["usage"]["prompt_tokens"] // 16
    assert p["do_remote_prefill"] is True and p["do_remote_decode"] is False
    assert len(p["remote_block_ids"]) == n > 5
    assert len(set(p["remote_block_ids"])) == n
    assert p["remote_host"] == "127.0.0.1" and p["remote_port"] == prefill.port
    assert p["remote_request_id"] and p["remote_engine_id"]
    assert ans["usage"]["completion_tokens"] == 1
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == n
    assert metric(prefill, "kvroute_sim:kv_held_requests") == 1
    entry = requests_log(prefill)[-1]
    assert entry["request_id"] == "pd-1"
    assert entry["max_tokens"] == 1 and entry["stream"] is False
    assert entry["kv_transfer_params"]["do_remote_decode"] is True
    assert entry["pd"] == "prefill"
    assert entry["kv_transfer"]["held_blocks"] == n


def test_nixl_decode_fetches_and_does_not_recompute(pd_pair):
    prefill, decode = pd_pair
    ans = prefill_then(prefill)
    params = ans["kv_transfer_params"]
    n = len(params["remote_block_ids"])
    r = post(decode, chat_req(kv_transfer_params=params), "pd-1")
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    ptok = usage["prompt_tokens"]
    assert ptok == ans["usage"]["prompt_tokens"]
    # the transferred blocks count as cached (at most prompt - 1 tokens, as vLLM caps hits)
    assert usage["prompt_tokens_details"]["cached_tokens"] == min(n, (ptok - 1) // 16) * 16
    assert usage["completion_tokens"] == 8
    m = decode.metrics()
    assert m.get("kvroute_sim:kv_transfer_blocks_total", result="fetched") == n
    assert m.get("kvroute_sim:kv_transfer_blocks_total", result="failed") == 0
    assert m.get("kvroute_sim:kv_transfers_total", result="fetched") == 1
    assert m.get("kvroute_sim:kv_recomputed_requests_total") == 0
    # the prefill let go of the blocks once they were fetched
    pm = prefill.metrics()
    assert pm.get("kvroute_sim:kv_held_blocks") == 0
    assert pm.get("kvroute_sim:kv_holds_total", outcome="fetched") == 1
    entry = requests_log(decode)[-1]
    assert entry["request_id"] == "pd-1" and entry["pd"] == "decode"
    assert entry["kv_transfer"] == {"role": "decode", "result": "fetched", "blocks": n,
                                    "reason": None, "recomputed": False}
    assert entry["kv_transfer_params"]["remote_block_ids"] == params["remote_block_ids"]
    assert entry["usage"]["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    log = decode.read_log()
    assert 'msg="kv transfer" request_id="pd-1" result=fetched blocks=%d' % n in log
    assert "kv_transfer=fetched" in log and "recomputed=false" in log
    # a second fetch of the same id finds nothing: the hold has ended
    again = post(decode, chat_req(kv_transfer_params=params), "pd-1b")
    assert again.status_code == 200
    assert decode.metrics().get("kvroute_sim:kv_recomputed_requests_total") == 1


def test_nixl_decode_streams_with_cached_usage(pd_pair):
    prefill, decode = pd_pair
    params = prefill_then(prefill, "pd-s")["kv_transfer_params"]
    body = chat_req(kv_transfer_params=params, stream=True,
                    stream_options={"include_usage": True})
    with decode.client.stream("POST", "/v1/chat/completions", json=body,
                              headers={"X-Request-Id": "pd-s"}) as r:
        assert r.status_code == 200
        chunks = [json.loads(l[6:]) for l in r.iter_lines()
                  if l.startswith("data: {")]
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 16 * (len(params["remote_block_ids"]) - 1)
    entry = requests_log(decode)[-1]
    assert entry["stream"] is True and entry["kv_transfer"]["result"] == "fetched"


def test_failed_transfer_recomputes_prefill_gone(pd_pair):
    prefill, decode = pd_pair
    params = prefill_then(prefill, "pd-gone")["kv_transfer_params"]
    n = len(params["remote_block_ids"])
    assert prefill.stop() == 0
    r = post(decode, chat_req(kv_transfer_params=params), "pd-gone")
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    m = decode.metrics()
    assert m.get("kvroute_sim:kv_transfer_blocks_total", result="failed") == n
    assert m.get("kvroute_sim:kv_transfer_blocks_total", result="fetched") == 0
    assert m.get("kvroute_sim:kv_transfers_total", result="failed") == 1
    assert m.get("kvroute_sim:kv_recomputed_requests_total") == 1
    entry = requests_log(decode)[-1]
    assert entry["kv_transfer"]["result"] == "failed" and entry["kv_transfer"]["recomputed"]
    assert "no answer" in entry["kv_transfer"]["reason"]
    assert "recomputing" in decode.read_log() and "recomputed=true" in decode.read_log()


def test_failed_transfer_fault_on_prefill(pd_pair):
    prefill, decode = pd_pair
    prefill.faults(kv_transfer_fail_rate=1)
    params = prefill_then(prefill, "pd-f")["kv_transfer_params"]
    r = post(decode, chat_req(kv_transfer_params=params), "pd-f")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "500" in requests_log(decode)[-1]["kv_transfer"]["reason"]
    assert prefill.metrics().get("kvroute_sim:kv_holds_total", outcome="failed") == 1
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == 0


def test_failed_transfer_fault_on_decode(pd_pair):
    prefill, decode = pd_pair
    decode.faults(kv_transfer_fail_rate=1)
    params = prefill_then(prefill, "pd-d")["kv_transfer_params"]
    r = post(decode, chat_req(kv_transfer_params=params), "pd-d")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "injected" in requests_log(decode)[-1]["kv_transfer"]["reason"]
    assert metric(decode, "kvroute_sim:kv_recomputed_requests_total") == 1
    # the prefill still holds them (until --kv-hold-ms)
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == len(params["remote_block_ids"])


def test_failed_transfer_other_prompt(pd_pair):
    prefill, decode = pd_pair
    params = prefill_then(prefill, "pd-o")["kv_transfer_params"]
    r = post(decode, chat_req(text="a different question entirely " * 20,
                              kv_transfer_params=params), "pd-o")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "not this prompt" in requests_log(decode)[-1]["kv_transfer"]["reason"]


def test_prefill_drops_params_fault(pd_pair):
    prefill, decode = pd_pair
    prefill.faults(kv_params_drop_rate=1)
    ans = prefill_then(prefill, "pd-x")
    assert "kv_transfer_params" not in ans
    assert metric(prefill, "kvroute_sim:kv_params_dropped_total") == 1
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == 0
    assert requests_log(prefill)[-1]["kv_transfer"]["params_dropped"] is True


def test_hold_expires(sim_factory):
    prefill = sim_factory("--time-scale", "0", "--role", "prefill", "--kv-hold-ms", "200")
    decode = sim_factory("--time-scale", "0", "--role", "decode")
    params = prefill_then(prefill, "pd-e")["kv_transfer_params"]
    assert metric(prefill, "kvroute_sim:kv_held_blocks") > 0
    deadline = time.monotonic() + 5
    while metric(prefill, "kvroute_sim:kv_held_blocks") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == 0
    assert metric(prefill, "kvroute_sim:kv_holds_total", outcome="expired") == 1
    r = post(decode, chat_req(kv_transfer_params=params), "pd-e")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "404" in requests_log(decode)[-1]["kv_transfer"]["reason"]


def test_transfer_takes_us_per_block(sim_factory):
    prefill = sim_factory("--time-scale", "0", "--role", "prefill")
    decode = sim_factory("--time-scale", "1", "--role", "decode",
                         "--kv-transfer-us-per-block", "20000", "--step-overhead-us", "0",
                         "--prefill-us-per-token", "0", "--decode-us-per-token", "0")
    params = prefill_then(prefill, "pd-t")["kv_transfer_params"]
    n = len(params["remote_block_ids"])
    t0 = time.monotonic()
    r = post(decode, chat_req(kv_transfer_params=params, max_tokens=1), "pd-t")
    took = time.monotonic() - t0
    assert r.status_code == 200
    assert took >= n * 0.020 * 0.95, (took, n)
    assert "transfer_ms=" in decode.read_log()


def test_role_both_plays_either_part(sim_factory):
    a = sim_factory("--time-scale", "0")  # --role both (default)
    b = sim_factory("--time-scale", "0")
    params = prefill_then(a, "pd-b")["kv_transfer_params"]
    r = post(b, chat_req(kv_transfer_params=params), "pd-b")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # a decode-only sim ignores do_remote_decode: no parameters in its answer
    d = sim_factory("--time-scale", "0", "--role", "decode")
    assert "kv_transfer_params" not in prefill_then(d, "pd-b2")


def test_decode_into_a_data_parallel_rank(sim_factory):
    prefill = sim_factory("--time-scale", "0", "--role", "prefill")
    decode = sim_factory("--time-scale", "0", "--role", "decode", "--data-parallel-size", "2")
    params = prefill_then(prefill, "pd-dp")["kv_transfer_params"]
    r = post(decode, chat_req(kv_transfer_params=params), "pd-dp",
             headers={"X-data-parallel-rank": "1"})
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    ranks = decode.stats()["ranks"]
    assert ranks[0]["kv_blocks_cached"] == 0 and ranks[1]["kv_blocks_cached"] > 0
    entry = requests_log(decode)[-1]
    assert entry["x_data_parallel_rank"] == "1" and entry["rank"] == 1


@pytest.mark.parametrize("field,value", [
    ("kv_transfer_params", 5),
    ("kv_transfer_params", {"do_remote_prefill": "yes"}),
    ("kv_transfer_params", {"do_remote_prefill": True, "remote_port": 70000}),
    ("kv_transfer_params", {"remote_block_ids": [1, -2]}),
    ("kv_transfer_params", {"remote_host": "x" * 300}),
    ("bootstrap_room", -1),
    ("bootstrap_room", "12"),
    ("bootstrap_port", 0),
])
def test_bad_transfer_fields_are_400(sim, field, value):
    r = post(sim, chat_req(**{field: value}))
    assert_openai_error(r, 400)


def test_transfer_endpoint_bad_input(sim):
    assert sim.client.get("/sim/kv_transfer/nothing-here").status_code == 404
    import http.client
    for bad in ("/sim/kv_transfer/%zz", "/sim/kv_transfer/a%00b"):
        c = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
        c.request("GET", bad)
        resp = c.getresponse()
        assert resp.status == 400
        assert json.loads(resp.read())["error"]["message"]
        c.close()
    assert sim.client.get("/sim/bootstrap/abc").status_code == 400
    assert sim.client.get("/sim/bootstrap/5?wait_ms=50").status_code == 404
    assert sim.client.post("/sim/kv_transfer/x").status_code == 405


def test_request_log_is_bounded_and_clears(sim_factory):
    sim = sim_factory("--time-scale", "0", "--request-log-size", "3")
    for i in range(5):
        post(sim, chat_req("q%d" % i, max_tokens=2), "r%d" % i)
    got = requests_log(sim)
    assert [e["request_id"] for e in got] == ["r2", "r3", "r4"]
    assert all(e["kv_transfer_params"] is None and e["bootstrap_room"] is None for e in got)
    assert sim.client.post("/sim/requests").json() == []
    assert requests_log(sim) == []


# ---- prefill/decode: SGLang's bootstrap handshake (concurrent)

@pytest.mark.parametrize("roles", [("prefill", "decode"), ("both", "both")])
def test_bootstrap_decode_waits_for_prefill(sim_factory, roles):
    import threading
    bport = free_port()
    prefill = sim_factory("--time-scale", "0", "--role", roles[0], "--bootstrap-port", bport)
    decode = sim_factory("--time-scale", "0", "--role", roles[1])
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": bport,
            "bootstrap_room": 2 ** 62 + 7}
    out = {}

    def run_decode():
        out["r"] = post(decode, chat_req(**boot), "sg-1")

    t = threading.Thread(target=run_decode)
    t.start()
    time.sleep(0.3)  # the decode asks first and waits for the room
    pr = post(prefill, chat_req(max_tokens=4, **boot), "sg-1")
    assert pr.status_code == 200
    assert "kv_transfer_params" not in pr.json()
    t.join(10)
    r = out["r"]
    assert r.status_code == 200, r.text
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    m = decode.metrics()
    n = m.get("kvroute_sim:kv_transfer_blocks_total", result="fetched")
    assert n > 0 and cached == min(n, (r.json()["usage"]["prompt_tokens"] - 1) // 16) * 16
    assert m.get("kvroute_sim:kv_recomputed_requests_total") == 0
    entry = requests_log(decode)[-1]
    assert entry["bootstrap_room"] == 2 ** 62 + 7 and entry["kv_transfer"]["result"] == "fetched"
    assert metric(prefill, "kvroute_sim:kv_held_blocks") == 0


def test_bootstrap_room_never_prefilled_recomputes(sim_factory):
    bport = free_port()
    sim_factory("--time-scale", "0", "--role", "prefill", "--bootstrap-port", bport)
    decode = sim_factory("--time-scale", "0", "--role", "decode",
                         "--kv-transfer-timeout-ms", "300")
    t0 = time.monotonic()
    r = post(decode, chat_req(bootstrap_host="127.0.0.1", bootstrap_port=bport,
                              bootstrap_room=99))
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert time.monotonic() - t0 < 5
    assert metric(decode, "kvroute_sim:kv_recomputed_requests_total") == 1


def test_decode_announces_transferred_blocks(sim_factory):
    """The blocks a decode receives enter its prefix cache like computed ones: one BlockStored
    with the prompt's tokens, before the decode's own blocks."""
    port = free_port()
    prefill = sim_factory("--time-scale", "0", "--role", "prefill")
    decode = sim_factory("--time-scale", "0", "--role", "decode",
                         "--kv-events-endpoint", "tcp://*:%d" % port)
    ctx = zmq.Context()
    try:
        sock = _subscriber(ctx, "tcp://127.0.0.1:%d" % port)
        _warm_up_sub(decode, [sock], lambda k: None)
        params = prefill_then(prefill, "pd-ev")["kv_transfer_params"]
        n = len(params["remote_block_ids"])
        post(decode, chat_req(kv_transfer_params=params, max_tokens=1), "pd-ev")
        got = _stored_batches(sock, 1)
        stored = [ev for _, p in got for ev in p[1] if ev[0] == "BlockStored"]
        # one event for the blocks the decode lacked: the warm-up cached the system prompt's
        # leading blocks already, so the new run starts after them, with a parent
        assert stored
        k = n - len(stored[0][1])
        assert 0 < k < n and stored[0][2] is not None
        toks = decode.tokenize(model=MODEL, messages=[SYSTEM, {"role": "user", "content": LONG}])
        assert stored[0][3] == toks[k * 16:n * 16]
    finally:
        ctx.destroy(linger=0)


def test_dp_ranks_behave_exactly_like_separate_sims(sim_factory):
    """Rank r of a --data-parallel-size 4 sim answers a request sequence with the same cached
    tokens as a separate sim of the same --kv-blocks given the same sequence, evictions
    included: the ranks share nothing that changes caching."""
    flags = ("--time-scale", "0", "--kv-blocks", "64")
    dp = sim_factory(*flags, "--data-parallel-size", "4")
    singles = [sim_factory(*flags) for _ in range(4)]
    import random
    rnd = random.Random(7)
    convs = {s: [SYSTEM] for s in range(10)}
    got_dp, got_single = [], []
    for i in range(60):
        s = rnd.randrange(10)
        convs[s].append({"role": "user", "content": "turn %d of session %d: %s" % (
            i, s, "words " * rnd.randrange(5, 40))})
        body = {"model": MODEL, "max_tokens": 6, "messages": convs[s]}
        rank = s % 4
        a = dp.client.post("/v1/chat/completions", json=body,
                           headers={"X-data-parallel-rank": str(rank)}).json()
        b = singles[rank].client.post("/v1/chat/completions", json=body).json()
        got_dp.append(cached(a))
        got_single.append(cached(b))
        convs[s].append({"role": "assistant", "content": a["choices"][0]["message"]["content"]})
    assert got_dp == got_single
    assert sum(got_dp) > 0
    st = dp.stats()
    assert sum(r["evictions"] for r in st["ranks"]) == sum(x.stats()["evictions"] for x in singles)
    assert st["evictions"] > 0


def test_nixl_text_completions(pd_pair):
    prefill, decode = pd_pair
    body = {"model": MODEL, "prompt": LONG, "max_tokens": 1, "stream": False,
            "kv_transfer_params": PREFILL_PARAMS}
    ans = prefill.client.post("/v1/completions", json=body).json()
    params = ans["kv_transfer_params"]
    assert ans["object"] == "text_completion" and params["remote_block_ids"]
    body.update(max_tokens=4, kv_transfer_params=params)
    r = decode.client.post("/v1/completions", json=body).json()
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert requests_log(decode)[-1]["path"] == "/v1/completions"
