"""End-to-end tests of kvroute-sim: real processes on 127.0.0.1, every wait bounded.

The `sim` and `sim_factory` fixtures (conftest.py) start build/kvroute-sim (or
$KVROUTE_BUILD/kvroute-sim) on an ephemeral port, wait for /health, and stop it by pid at
teardown, where a clean exit (status 0) is required. Uses python3 stdlib, httpx, zmq and
msgpack (Debian packages; run with /usr/bin/python3 -m pytest).
"""

import http.client
import json
import threading
import time

import httpx
import msgpack
import pytest
import zmq

from conftest import SIM_MODEL as MODEL  # the sim and sim_factory fixtures: conftest.py
from conftest import assert_openai_error, free_port, parse_sse, wait_until


def lines(response):
    """SSE lines without their line endings (httpx 0.23's iter_lines keeps them)."""
    for line in response.iter_lines():
        yield line.rstrip("\r\n")


def series(metrics, name, **labels):
    """Value of the first series `name` whose labels include `labels` (a conftest.Metrics)."""
    found = metrics.find(name, **labels)
    if not found:
        raise KeyError(name)
    return found[0][1]


SYSTEM = {"role": "system", "content": "You are a careful assistant who answers briefly. " * 8}


def test_conversation_cached_tokens_grow_on_the_serving_worker(sim_factory):
    warm = sim_factory("--time-scale", "0")
    fresh = sim_factory("--time-scale", "0")
    messages = [SYSTEM, {"role": "user", "content": "Tell me about prefix caching in vLLM."}]
    cached = []
    prev_prompt = 0
    for turn in range(5):
        resp = warm.chat(messages, max_tokens=24)
        usage = resp["usage"]
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        assert usage["completion_tokens"] == 24
        assert usage["prompt_tokens"] > prev_prompt
        # everything before this turn's new user message was cached (block-aligned)
        if turn > 0:
            assert cached[-1] >= prev_prompt - 16
            assert cached[-1] % 16 == 0
        prev_prompt = usage["prompt_tokens"]
        answer = resp["choices"][0]["message"]["content"]
        # the same conversation on a worker that never saw it: nothing cached
        cold = fresh.chat(messages, max_tokens=1) if turn == 4 else None
        if cold:
            assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert cold["usage"]["prompt_tokens"] == usage["prompt_tokens"]
        messages = messages + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And what about turn {turn + 2}?"},
        ]
    assert cached[0] == 0
    assert all(b > a for a, b in zip(cached, cached[1:])), cached


def test_tokenize_prefix_property_across_turns(sim):
    msgs = [SYSTEM, {"role": "user", "content": "hi there"}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    prev = sim.tokenize(messages=msgs, tools=tools)
    assert prev == sim.tokenize(messages=msgs, tools=tools)  # deterministic
    for turn in range(3):
        resp = sim.chat(msgs, max_tokens=20, tools=tools)
        answer = resp["choices"][0]["message"]["content"]
        msgs = msgs + [
            {"role": "assistant", "content": answer,
             "tool_calls": [{"id": f"c{turn}", "type": "function",
                             "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "result"},
            {"role": "user", "content": "more"},
        ]
        cur = sim.tokenize(messages=msgs, tools=tools)
        assert cur[: len(prev)] == prev
        assert len(cur) > len(prev) + 20
        prev = cur
    assert all(0 <= t < 128256 for t in prev)
    # completions form, with and without special tokens
    with_bos = sim.tokenize(prompt="hello world")
    assert with_bos[0] == 128000
    assert sim.tokenize(prompt="hello world", add_special_tokens=False) == with_bos[1:]


def test_metrics_agree_with_usage(sim):
    totals = {"prompt": 0, "completion": 0, "cached": 0}
    n = 0
    for i in range(6):
        msgs = [SYSTEM, {"role": "user", "content": f"question {i % 3}"}]
        stream = i % 2 == 1
        body = {"model": MODEL, "messages": msgs, "max_tokens": 5 + i, "stream": stream,
                "stream_options": {"include_usage": True}}
        r = sim.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        if stream:
            usage = [json.loads(l[6:]) for l in r.text.splitlines()
                     if l.startswith("data: {")][-1]["usage"]
        else:
            usage = r.json()["usage"]
        totals["prompt"] += usage["prompt_tokens"]
        totals["completion"] += usage["completion_tokens"]
        totals["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
        n += 1
    r = sim.client.post("/v1/completions", json={"prompt": "once upon a time", "max_tokens": 3})
    usage = r.json()["usage"]
    totals["prompt"] += usage["prompt_tokens"]
    totals["completion"] += usage["completion_tokens"]
    totals["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
    n += 1
    assert totals["cached"] > 0
    m = sim.metrics()
    lab = {"model_name": MODEL}
    assert series(m, "vllm:prompt_tokens_total", **lab) == totals["prompt"]
    assert series(m, "vllm:generation_tokens_total", **lab) == totals["completion"]
    assert series(m, "vllm:prefix_cache_queries_total", **lab) == totals["prompt"]
    assert series(m, "vllm:prefix_cache_hits_total", **lab) == totals["cached"]
    assert series(m, "vllm:request_success_total", finished_reason="length", **lab) == n
    assert series(m, "vllm:time_to_first_token_seconds_count", **lab) == n
    assert series(m, "vllm:num_requests_running", **lab) == 0
    assert series(m, "vllm:num_requests_waiting", **lab) == 0
    assert series(m, "vllm:kv_cache_usage_perc", **lab) == 0
    assert series(m, "vllm:cache_config_info", block_size="16", num_gpu_blocks="28000") == 1


def test_response_shapes_and_streaming(sim):
    msgs = [{"role": "user", "content": "hello"}]
    r = sim.client.post("/v1/chat/completions", headers={"x-request-id": "abc-1"},
                        json={"messages": msgs})  # model omitted, default max_tokens 16
    body = r.json()
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-request-id"] == "abc-1"
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 16
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 16
    # the same prompt twice gives the same text (deterministic, like temperature 0)
    assert sim.chat(msgs)["choices"][0]["message"]["content"] == choice["message"]["content"]

    with sim.client.stream("POST", "/v1/chat/completions",
                           json={"messages": msgs, "max_tokens": 4, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [l[6:] for l in lines(r) if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(chunks) == 5 and all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == sim.chat(msgs, max_tokens=4)["choices"][0]["message"]["content"]

    r = sim.client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    events = [l[6:] for l in r.text.splitlines() if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert json.loads(events[0])["object"] == "text_completion"

    models = sim.client.get("/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    assert sim.client.get("/health").status_code == 200


def test_errors(sim):
    c = sim.client
    r = c.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = c.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    assert c.post("/v1/chat/completions",
                  json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).status_code == 400
    r = c.post("/v1/chat/completions",
               json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 200000})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    assert c.post("/v1/completions", json={"prompt": ["a", "b"]}).status_code == 400
    assert c.get("/v1/chat/completions").status_code == 405
    assert c.get("/nope").status_code == 404
    # still serving
    assert sim.chat([{"role": "user", "content": "x"}], max_tokens=1)["usage"]["completion_tokens"] == 1


def ttft_of(sim, body):
    """Seconds to the first SSE content event. http.client sends headers and body in one
    write, so the client's Nagle + the server's delayed ACK add nothing (httpx 0.23 would)."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    try:
        payload = json.dumps({**body, "stream": True}).encode()
        t0 = time.monotonic()
        conn.request("POST", "/v1/chat/completions", body=payload,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        while True:
            line = resp.readline()
            assert line, "stream ended before any token"
            if line.startswith(b"data: {") and b'"content":"' in line:
                return time.monotonic() - t0
    finally:
        conn.close()


def test_cache_hit_shortens_ttft(sim_factory):
    # real time, a long prompt: cold prefill = 6 ms + ~3500 tokens × 25 µs ≈ 0.09 s;
    # warm (all but the last block cached) ≈ 6.4 ms
    s = sim_factory("--time-scale", "1")
    body = {"messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * 700}],
            "max_tokens": 2}
    cold, warm = ttft_of(s, body), ttft_of(s, body)
    assert cold > 0.08, cold
    assert warm < cold / 2, (cold, warm)
    # the engine's own histogram saw the same two first tokens
    m = s.metrics()
    assert series(m, "vllm:time_to_first_token_seconds_count") == 2
    assert series(m, "vllm:time_to_first_token_seconds_sum") == pytest.approx(cold + warm, abs=0.03)


def test_queueing_beyond_max_num_seqs(sim_factory):
    s = sim_factory("--time-scale", "1", "--max-num-seqs", "1", "--step-overhead-us", "20000",
                    "--decode-us-per-token", "0")
    # each request: 10 steps of 20 ms; the second waits for the first
    results = {}

    def run(i):
        t0 = time.monotonic()
        s.chat([{"role": "user", "content": f"q{i}"}], max_tokens=10)
        results[i] = time.monotonic() - t0

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    # while the first runs (~0.2 s), the second waits: poll until both are in (bounded)
    deadline, seen = time.monotonic() + 2, None
    while time.monotonic() < deadline:
        m = s.metrics()
        seen = (series(m, "vllm:num_requests_running"), series(m, "vllm:num_requests_waiting"))
        if seen == (1, 1):
            break
        time.sleep(0.01)
    assert seen == (1, 1), seen
    for t in threads:
        t.join(timeout=10)
    assert max(results.values()) > 0.35


def test_client_disconnect_frees_blocks(sim_factory):
    s = sim_factory("--time-scale", "1")
    with s.client.stream("POST", "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "long story " * 100}],
                               "max_tokens": 5000, "stream": True}) as r:
        # The line iterator stays referenced until the client leaves the block: a loop's
        # iterator dropped after `break` is closed at once, and closing it closes the response,
        # which disconnected the client before the check below could see the blocks in use
        # (the check lost that race now and then on a loaded machine).
        it = lines(r)
        for line in it:
            if line.startswith("data: {"):
                break
        st = s.stats()
        assert st["running"] == 1 and st["kv_blocks_used"] > 0, st
        it.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        st = s.stats()
        if st["running"] == 0 and st["kv_blocks_used"] == 0:
            break
        time.sleep(0.02)
    assert st["running"] == 0 and st["kv_blocks_used"] == 0, st
    assert st["kv_blocks_cached"] > 0  # freed blocks stay cached


def test_eviction_under_capacity(sim_factory):
    s = sim_factory("--time-scale", "0", "--kv-blocks", "64")
    a = [{"role": "user", "content": "alpha " * 600}]  # ~610 tokens: 38 full blocks
    b = [{"role": "user", "content": "bravo " * 600}]
    s.chat(a, max_tokens=1)
    before = s.chat(a, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert before >= 600
    s.chat(b, max_tokens=1)  # 64 blocks cannot hold both: LRU evicts a's tail first (vLLM)
    after = s.chat(a, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < after < before, (before, after)
    assert s.stats()["evictions"] > 0
    # ~1000 tokens take 63 of the 64 blocks: at most a's head block (freed last) survives
    s.chat([{"role": "user", "content": "delta " * 990}], max_tokens=1)
    assert s.chat(a, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] <= 16
    # a request that can never fit gets 400, not a hang
    r = s.client.post("/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "x " * 2000}], "max_tokens": 1})
    assert r.status_code == 400


# ---- KV events ----

def recv_batch(sock, timeout_ms=3000):
    if not sock.poll(timeout_ms):
        raise AssertionError("no KV event batch within timeout")
    return sock.recv_multipart()


def decode_events(payload):
    ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
    assert isinstance(ts, float) and dp_rank == 0
    out = []
    for e in events:
        if isinstance(e, dict):
            out.append(e)
        else:  # positional: tag then fields in declaration order
            names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                     "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                                     "kv_cache_spec_kind"],
                     "BlockRemoved": ["block_hashes", "medium", "group_idx"],
                     "AllBlocksCleared": []}[e[0]]
            out.append({"type": e[0], **dict(zip(names, e[1:]))})
    return out


@pytest.mark.parametrize("fmt", ["array", "map"])
def test_kv_events_decode_with_python(sim_factory, fmt):
    pub, rep = free_port(), free_port()
    s = sim_factory("--time-scale", "0", "--kv-events-format", fmt, "--kv-events-bind", "bind",
                    "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                    "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}",
                    "--kv-events-topic", "kv@sim", "--kv-blocks", "40")
    ctx = zmq.Context()
    try:
        msgs = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 12}]
        tokens = s.tokenize(messages=msgs)
        s.chat(msgs, max_tokens=8)

        # replay from 0 over a DEALER: everything so far, then the end marker
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{rep}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = []
        while True:
            frames = recv_batch(dealer)
            assert frames[0] == b"" and len(frames) == 4  # [empty, topic, seq, payload]
            assert frames[1] == b"kv@sim"
            seq = int.from_bytes(frames[2], "big")
            if seq == 2**64 - 1:
                assert frames[3] == b""
                break
            batches.append((seq, decode_events(frames[3])))
        assert [b[0] for b in batches] == list(range(len(batches)))
        stored = [e for _, evs in batches for e in evs if e["type"] == "BlockStored"]
        first = stored[0]
        assert first["parent_block_hash"] is None and first["block_size"] == 16
        assert first["medium"] == "GPU" and first["lora_id"] is None
        n = len(first["block_hashes"])
        assert first["token_ids"] == tokens[: 16 * n]  # the engine cached the prompt as tokenized
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in first["block_hashes"])
        if len(stored) > 1:  # decode blocks chain onto the prompt's last block
            assert stored[1]["parent_block_hash"] == first["block_hashes"][-1]

        # live: a SUB sees new batches with the next sequence numbers
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sub.connect(f"tcp://127.0.0.1:{pub}")
        seen = []
        deadline = time.monotonic() + 10
        i = 0
        while not seen and time.monotonic() < deadline:  # PUB/SUB join is asynchronous
            s.chat([{"role": "user", "content": f"unique prompt number {i} " * 30}], max_tokens=2)
            i += 1
            while sub.poll(100):
                seen.append(sub.recv_multipart())
        assert seen, "SUB never received a batch"
        topic, seqb, payload = seen[0]
        assert topic == b"kv@sim" and len(seqb) == 8
        assert int.from_bytes(seqb, "big") >= len(batches)
        # 40 blocks fill up: evictions appear as BlockRemoved
        for j in range(6):
            s.chat([{"role": "user", "content": f"filler {j} " * 60}], max_tokens=1)
        removed = []
        deadline = time.monotonic() + 5
        while not removed and time.monotonic() < deadline:
            if sub.poll(200):
                evs = decode_events(sub.recv_multipart()[2])
                removed += [e for e in evs if e["type"] == "BlockRemoved"]
        assert removed and len(removed[0]["block_hashes"]) == 1

        # reset: AllBlocksCleared, and nothing is cached afterwards
        assert s.client.post("/sim/reset_prefix_cache").status_code == 200
        cleared = False
        deadline = time.monotonic() + 5
        while not cleared and time.monotonic() < deadline:
            if sub.poll(200):
                cleared = any(e["type"] == "AllBlocksCleared"
                              for e in decode_events(sub.recv_multipart()[2]))
        assert cleared
        assert s.chat(msgs, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        ctx.destroy(linger=0)


def test_kv_events_connect_mode_like_vllm(sim_factory):
    # vLLM connects (not binds) to a plain tcp://host:port endpoint: the subscriber binds
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        s = sim_factory("--time-scale", "0", "--kv-events-endpoint", f"tcp://127.0.0.1:{port}")
        got = None
        deadline = time.monotonic() + 10
        i = 0
        while got is None and time.monotonic() < deadline:
            s.chat([{"role": "user", "content": f"connect mode {i} " * 20}], max_tokens=1)
            i += 1
            if sub.poll(100):
                got = sub.recv_multipart()
        assert got is not None
        assert got[0] == b"" and len(got[1]) == 8
        assert decode_events(got[2])[0]["type"] == "BlockStored"
    finally:
        ctx.destroy(linger=0)


# ---- faults ----

def test_fail_rate_is_deterministic_with_seed(sim_factory):
    def pattern():
        s = sim_factory("--time-scale", "0", "--seed", "7", "--fail-rate", "0.5",
                        "--fail-status", "503")
        codes = []
        for _ in range(20):
            r = s.client.post("/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
            codes.append(r.status_code)
            if r.status_code != 200:
                assert r.json()["error"]["code"] == "injected_failure"
        return codes

    a, b = pattern(), pattern()
    assert a == b
    assert set(a) == {200, 503}


def test_delay_and_health_and_runtime_faults(sim_factory):
    s = sim_factory("--time-scale", "0", "--delay-ms", "300", "--health-status", "503")
    assert s.client.get("/health").status_code == 503
    t0 = time.monotonic()
    s.chat([{"role": "user", "content": "x"}], max_tokens=1)
    assert time.monotonic() - t0 >= 0.29
    r = s.client.post("/sim/faults", json={"delay_ms": 0, "health_status": 200})
    assert r.status_code == 200 and r.json()["delay_ms"] == 0
    assert s.client.get("/health").status_code == 200
    t0 = time.monotonic()
    s.chat([{"role": "user", "content": "x"}], max_tokens=1)
    assert time.monotonic() - t0 < 0.25
    assert s.client.post("/sim/faults", json={"fail_rate": 2}).status_code == 400


def test_stall_after_events(sim_factory):
    s = sim_factory("--time-scale", "0", "--stall-after-events", "3")
    got = []
    with pytest.raises(httpx.ReadTimeout):
        with s.client.stream("POST", "/v1/chat/completions", timeout=httpx.Timeout(10, read=1.0),
                             json={"messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 10, "stream": True}) as r:
            for line in lines(r):
                if line.startswith("data: "):
                    got.append(line)
    assert len(got) == 3
    # the sim keeps serving, and the stalled request's blocks were freed
    assert s.stats()["kv_blocks_used"] == 0


def test_drop_after_events(sim_factory):
    s = sim_factory("--time-scale", "0", "--drop-after-events", "2")
    got = []
    with pytest.raises(httpx.RemoteProtocolError):
        with s.client.stream("POST", "/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": 10, "stream": True}) as r:
            for line in lines(r):
                if line.startswith("data: "):
                    got.append(line)
    assert len(got) == 2
    # a non-streaming request under the same fault still completes (one "event": the body)
    assert s.chat([{"role": "user", "content": "y"}], max_tokens=2)["usage"]["completion_tokens"] == 2
    s.client.post("/sim/faults", json={"drop_after_events": 0})
    with pytest.raises(httpx.RemoteProtocolError):
        s.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "z"}]})
    deadline = time.monotonic() + 5
    while s.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert s.stats()["kv_blocks_used"] == 0


# ---- /tokenize, /detokenize ----

def detok(sim, tokens, **kw):
    r = sim.client.post("/detokenize", json={"tokens": tokens, **kw})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_detokenize_round_trip_and_placeholders(sim_factory):
    s = sim_factory("--time-scale", "0")
    msgs = [{"role": "user", "content": "Tell me about caches"}]
    text = s.chat(msgs, max_tokens=40)["choices"][0]["message"]["content"]
    ids = s.tokenize(prompt=text, add_special_tokens=False)
    assert len(ids) == 40  # the generated text tokenizes back to the generated ids
    assert detok(s, ids, model=MODEL) == text
    # a prompt's pieces were seen while tokenizing; specials print by their Llama 3.1 names
    assert detok(s, s.tokenize(messages=msgs)) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTell me about caches"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert detok(s, [128001, 128004, 128008, 128010, 128011, 128255]) == (
        "<|end_of_text|><|finetune_right_pad_id|><|eom_id|><|python_tag|>"
        "<|reserved_special_token_3|><|reserved_special_token_247|>")
    assert detok(s, []) == ""
    # a piece cut inside a character: alone it ends in U+FFFD, with its successor it is whole
    e = s.tokenize(prompt="ééééé", add_special_tokens=False)
    assert len(e) == 2 and detok(s, e) == "ééééé" and detok(s, e[:1]) == "ééé\ufffd"
    # token_strs (vLLM's return_token_strs) use the same texts
    r = s.client.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True})
    assert r.json()["token_strs"] == ["<|begin_of_text|>", "hello", " world"]
    assert s.client.post("/tokenize", json={"prompt": "x"}).json()["token_strs"] is None

    # without the map a prompt piece is a placeholder; generated text still prints
    bare = sim_factory("--time-scale", "0", "--detokenize-cache-entries", "0")
    [x] = bare.tokenize(prompt="zqxjvk", add_special_tokens=False)
    assert detok(bare, [x]) == "<|%d|>" % x
    assert detok(bare, ids) == text
    assert detok(s, s.tokenize(prompt="zqxjvk", add_special_tokens=False)) == "zqxjvk"
    assert bare.stats()["detokenize_pieces"] == 0 and s.stats()["detokenize_pieces"] > 10


def test_detokenize_bad_input(sim):
    c = sim.client
    assert_openai_error(c.post("/detokenize", content=b"{not json"), 400)
    assert_openai_error(c.post("/detokenize", content=b"[1, 2]"), 400)
    for body, words in [({}, "required"), ({"tokens": "1 2"}, "array"),
                        ({"tokens": [1, 1.5]}, "integers"), ({"tokens": [True]}, "integers"),
                        ({"tokens": [None]}, "integers"), ({"tokens": [-1]}, "vocabulary"),
                        ({"tokens": [128256]}, "vocabulary"), ({"tokens": [2**40]}, "vocabulary")]:
        r = c.post("/detokenize", json=body)
        err = assert_openai_error(r, 400)
        assert words in err["message"] and err["param"] == "tokens", (body, err)
    assert_openai_error(c.post("/detokenize", json={"tokens": [2**70]}), 400)  # beyond int64
    assert_openai_error(c.post("/detokenize", json={"model": "other", "tokens": [1]}), 404)
    assert c.get("/detokenize").status_code == 405
    assert detok(sim, [128000]) == "<|begin_of_text|>"  # still serving


def test_tokenize_chat_form_is_what_chat_caches(sim):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    msgs = [SYSTEM, {"role": "user", "content": "Which blocks does a repeat hit?"}]
    ids = sim.tokenize(messages=msgs, tools=tools)  # add_generation_prompt defaults to true
    usage = sim.chat(msgs, max_tokens=1, tools=tools)["usage"]
    assert usage["prompt_tokens"] == len(ids)
    # the same ids as a token prompt hit every block the chat cached (all but the last token)
    r = sim.client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}).json()
    assert r["usage"]["prompt_tokens"] == len(ids)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(ids) - 1) // 16 * 16
    # the other request fields, with vLLM's defaults
    no_gen = sim.tokenize(messages=msgs, tools=tools, add_generation_prompt=False)
    assert ids[: len(no_gen)] == no_gen and len(ids) > len(no_gen)
    assert sim.tokenize(messages=msgs, tools=tools, add_special_tokens=True) == [128000] + ids
    r = sim.client.post("/tokenize", json={"messages": msgs, "add_generation_prompt": "yes"})
    assert assert_openai_error(r, 400)["param"] == "add_generation_prompt"
    r = sim.client.post("/tokenize", json={"prompt": "x", "add_special_tokens": 1})
    assert assert_openai_error(r, 400)["param"] == "add_special_tokens"
    body = sim.client.post("/tokenize", json={"model": MODEL, "prompt": "hi"}).json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) == 2 and body["max_model_len"] == 131072


# ---- /v1/responses ----

INSTRUCTIONS = "You are a careful assistant who answers briefly. " * 6


def respond(sim, **body):
    r = sim.client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def output_text(resp):
    [item] = resp["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["status"] == "completed" and item["id"].startswith("msg_")
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    return part["text"]


def test_responses_json_and_stream(sim):
    body = {"model": MODEL, "input": "Explain prefix caching.", "instructions": INSTRUCTIONS,
            "max_output_tokens": 12}
    resp = respond(sim, **body)
    assert resp["id"].startswith("resp_") and resp["object"] == "response"
    assert resp["status"] == "completed" and resp["model"] == MODEL
    assert resp["previous_response_id"] is None and resp["instructions"] == INSTRUCTIONS
    assert isinstance(resp["created_at"], int) and resp["store"] is True
    text = output_text(resp)
    u = resp["usage"]
    assert u["output_tokens"] == 12 and u["total_tokens"] == u["input_tokens"] + 12
    assert u["input_tokens_details"]["cached_tokens"] == 0
    # rendered exactly like the chat form of the same conversation
    chat_form = [{"role": "system", "content": INSTRUCTIONS},
                 {"role": "user", "content": body["input"]}]
    assert u["input_tokens"] == len(sim.tokenize(messages=chat_form))
    assert text == sim.chat(chat_form, max_tokens=12)["choices"][0]["message"]["content"]

    with sim.client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.read())
    names = [e["event"] for e in events]
    datas = [json.loads(e["data"]) for e in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert names.count("response.output_text.delta") == 12
    assert [d["type"] for d in datas] == names
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    assert datas[0]["response"]["status"] == "in_progress" and datas[0]["response"]["usage"] is None
    deltas = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
    assert deltas == text == datas[-4]["text"]
    final = datas[-1]["response"]
    assert output_text(final) == text and final["id"] == datas[0]["response"]["id"]
    assert final["usage"]["input_tokens"] == u["input_tokens"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the JSON request's blocks


def test_responses_previous_response_id_chain(sim):
    prev, prev_input, cached, messages = None, 0, [], [{"role": "system", "content": INSTRUCTIONS}]
    for turn in range(4):
        body = {"input": f"Turn {turn}: tell me more about KV blocks.",
                "instructions": INSTRUCTIONS, "max_output_tokens": 24}
        if prev:
            body["previous_response_id"] = prev["id"]
        resp = respond(sim, **body)
        assert resp["previous_response_id"] == (prev["id"] if prev else None)
        u = resp["usage"]
        cached.append(u["input_tokens_details"]["cached_tokens"])
        if turn:  # the stored conversation, its answer included, was cached (block-aligned)
            assert cached[-1] >= prev_input + 24 - 16, (cached, prev_input)
        # the chain renders as chat would render the whole conversation
        messages.append({"role": "user", "content": body["input"]})
        assert u["input_tokens"] == len(sim.tokenize(messages=messages))
        messages.append({"role": "assistant", "content": output_text(resp)})
        prev, prev_input = resp, u["input_tokens"]
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:])), cached
    # the same conversation through chat completions hits the same blocks
    messages.append({"role": "user", "content": "And finally?"})
    chat = sim.chat(messages, max_tokens=1)["usage"]
    assert chat["prompt_tokens_details"]["cached_tokens"] >= prev_input + 24 - 16
    # a list input with content parts continues the chain the same way
    resp = respond(sim, previous_response_id=prev["id"], instructions=INSTRUCTIONS,
                   input=[{"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "And finally?"}]}],
                   max_output_tokens=1)
    assert resp["usage"]["input_tokens"] == chat["prompt_tokens"]
    assert sim.stats()["stored_responses"] == 5


def test_responses_unknown_previous_id_and_store(sim_factory):
    s = sim_factory("--time-scale", "0", "--max-stored-responses", "2")
    for bad in ["resp_nope", "resp_" + "0" * 24, "x" * 5000, "resp_é" + "1" * 300]:
        r = s.client.post("/v1/responses", json={"input": "hi", "previous_response_id": bad})
        assert r.status_code == 404
        assert r.json() == {"error": {
            "message": "Previous response with id '%s' not found." % bad[:200],
            "type": "invalid_request_error", "param": "previous_response_id",
            "code": "previous_response_not_found"}} or len(bad) > 200
        assert_openai_error(r, 404)
    unstored = respond(s, input="a", store=False, max_output_tokens=1)
    assert unstored["store"] is False
    r = s.client.post("/v1/responses", json={"input": "b", "previous_response_id": unstored["id"]})
    assert r.status_code == 404
    # at most 2 kept: the oldest goes first
    ids = [respond(s, input=f"q{i}", max_output_tokens=1)["id"] for i in range(3)]
    assert respond(s, input="c", previous_response_id=ids[2], max_output_tokens=1)
    r = s.client.post("/v1/responses", json={"input": "c", "previous_response_id": ids[0]})
    assert r.status_code == 404
    assert s.stats()["stored_responses"] == 2


def test_responses_bad_input_never_crashes(sim):
    c = sim.client
    bad = [
        {}, {"input": 5}, {"input": [5]}, {"input": [{"role": 1, "content": "x"}]},
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        {"input": [{"role": "user", "content": [{"type": "weird", "text": "x"}]}]},
        {"input": [{"role": "user", "content": 7}]}, {"input": "x", "instructions": 3},
        {"input": "x", "store": "yes"}, {"input": "x", "max_output_tokens": 0},
        {"input": "x", "max_output_tokens": 10**9}, {"input": "x", "stream": "no"},
        {"input": "x", "previous_response_id": 5}, {"input": "x", "tools": {}},
        {"input": "x", "tools": [1]},
    ]
    for body in bad:
        err = assert_openai_error(c.post("/v1/responses", json=body), 400)
        assert err["type"] == "invalid_request_error", (body, err)
    assert_openai_error(c.post("/v1/responses", content=b"{"), 400)
    assert_openai_error(c.post("/v1/responses", json={"model": "other", "input": "x"}), 404)
    assert c.get("/v1/responses").status_code == 405
    # accepted shapes: media parts, output_text in an assistant item, an empty list
    ok = respond(sim, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:,x"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "seen"}]},
        {"role": "user", "content": "ok?"}], max_output_tokens=2)
    assert ok["usage"]["output_tokens"] == 2
    # BOS + <|start_header_id|> "assista" "nt" <|end_header_id|> "\n\n"
    assert respond(sim, input=[], max_output_tokens=1)["usage"]["input_tokens"] == 6


def test_responses_stream_faults(sim_factory):
    s = sim_factory("--time-scale", "0", "--drop-after-events", "0")
    with pytest.raises(httpx.RemoteProtocolError):
        with s.client.stream("POST", "/v1/responses",
                             json={"input": "x", "stream": True, "max_output_tokens": 4}) as r:
            r.read()
    s.faults(drop_after_events=3)
    got = []
    with pytest.raises(httpx.RemoteProtocolError):
        with s.client.stream("POST", "/v1/responses",
                             json={"input": "y", "stream": True, "max_output_tokens": 4}) as r:
            got = [l for l in lines(r) if l.startswith("event: ")]
    assert len(got) <= 3
    wait_until(lambda: s.stats()["running"] == 0, 5, what="the dropped stream's sequence ended")
    assert s.stats()["kv_blocks_used"] == 0
    s.faults(drop_after_events=-1)
    assert respond(s, input="z", max_output_tokens=2)["status"] == "completed"


# ---- /sim/evict and KV-event faults ----

def events_sim(sim_factory, *extra):
    pub, rep = free_port(), free_port()
    s = sim_factory("--time-scale", "0", "--kv-events-bind", "bind",
                    "--kv-events-endpoint", f"tcp://127.0.0.1:{pub}",
                    "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{rep}", *extra)
    return s, pub, rep


def seq_of(frames):
    return int.from_bytes(frames[1], "big")


def drain(sub, quiet_ms=300):
    """Every batch the SUB receives until it has been quiet for quiet_ms."""
    out = []
    while sub.poll(quiet_ms):
        out.append(sub.recv_multipart())
    return out


def joined_sub(ctx, s, pub):
    """A SUB that has received at least one batch (the PUB/SUB join is asynchronous) and then
    drained everything; returns it and the last seq it saw."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{pub}")
    got, i, deadline = [], 0, time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        s.chat([{"role": "user", "content": f"join {i} " * 20}], max_tokens=1)
        i += 1
        got = drain(sub, 100)
    assert got, "SUB never received a batch"
    got += drain(sub)
    return sub, seq_of(got[-1])


def replay(ctx, rep, start, timeout_ms=3000):
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{rep}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        frames = recv_batch(dealer, timeout_ms)
        seq = int.from_bytes(frames[2], "big")
        if seq == 2**64 - 1:
            return out
        out.append((seq, frames[3]))


def test_sim_evict_removes_free_blocks_with_events(sim_factory):
    s, pub, _ = events_sim(sim_factory)
    ctx = zmq.Context()
    try:
        sub, _ = joined_sub(ctx, s, pub)
        msgs = [{"role": "user", "content": "Evict me on demand, please. " * 12}]
        assert s.chat(msgs, max_tokens=4)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        stored = [h for f in drain(sub) for e in decode_events(f[2])
                  if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert stored
        cached = s.stats()["kv_blocks_cached"]
        assert cached >= len(stored)
        r = s.client.post("/sim/evict")
        assert r.status_code == 200 and r.json() == {"evicted": cached}
        removed = []
        for f in drain(sub):
            for e in decode_events(f[2]):
                assert e["type"] == "BlockRemoved" and len(e["block_hashes"]) == 1
                removed += e["block_hashes"]
        assert len(removed) == cached and set(stored) <= set(removed)
        st = s.stats()
        assert st["kv_blocks_cached"] == 0 and st["evictions"] == cached
        assert s.chat(msgs, max_tokens=4)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        again = s.stats()["kv_blocks_cached"]
        assert again > 0 and s.client.post("/sim/evict").json() == {"evicted": again}
        assert s.client.post("/sim/evict").json() == {"evicted": 0}
        assert s.client.get("/sim/evict").status_code == 405
    finally:
        ctx.destroy(linger=0)


def test_sim_evict_while_a_request_runs(sim_factory):
    s = sim_factory("--time-scale", "1")
    done = [{"role": "user", "content": "finished request " * 40}]
    s.chat(done, max_tokens=1)
    free_cached = s.stats()["kv_blocks_cached"]
    with s.client.stream("POST", "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "running " * 100}],
                               "max_tokens": 5000, "stream": True}) as r:
        # keep the iterator referenced: a collected one closes the connection (an abort)
        it = lines(r)
        while not next(it).startswith("data: {"):
            pass
        running_cached = s.stats()["kv_blocks_cached"] - free_cached
        assert running_cached > 0
        assert s.client.post("/sim/reset_prefix_cache").status_code == 409  # vLLM refuses
        assert s.client.post("/sim/evict").json() == {"evicted": free_cached}
        assert s.stats()["kv_blocks_cached"] >= running_cached  # pinned blocks keep their hashes
        assert s.stats()["running"] == 1
        del it
    assert s.chat(done, max_tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_drop_event_batches_gap_and_replay(sim_factory):
    s, pub, rep = events_sim(sim_factory)
    ctx = zmq.Context()
    try:
        sub, last = joined_sub(ctx, s, pub)
        assert s.faults(drop_event_batches=2)["drop_event_batches"] == 2
        for i in range(5):  # one batch each (max_tokens 1: a single step)
            s.chat([{"role": "user", "content": f"batch {i} " * 20}], max_tokens=1)
        seen = [seq_of(f) for f in drain(sub)]
        st = s.stats()
        nxt = st["kv_events_next_seq"]
        assert st["kv_event_batches_dropped"] == 2
        assert nxt >= last + 6
        assert seen == list(range(last + 3, nxt)), (last, seen, nxt)  # the gap: last+1, last+2
        assert s.client.get("/sim/faults").json()["drop_event_batches"] == 0
        got = replay(ctx, rep, last + 1)
        assert [q for q, _ in got] == list(range(last + 1, nxt))  # the gap is recoverable
        assert all(decode_events(p)[0]["type"] == "BlockStored" for _, p in got[:2])
    finally:
        ctx.destroy(linger=0)


def test_drop_event_batches_flag(sim_factory):
    s, _, rep = events_sim(sim_factory, "--drop-event-batches", "1")
    assert s.client.get("/sim/faults").json()["drop_event_batches"] == 1
    s.chat([{"role": "user", "content": "first batch " * 20}], max_tokens=1)
    assert s.stats()["kv_event_batches_dropped"] == 1
    assert s.client.get("/sim/faults").json()["drop_event_batches"] == 0
    ctx = zmq.Context()
    try:
        assert [q for q, _ in replay(ctx, rep, 0)] == [0]
    finally:
        ctx.destroy(linger=0)
    for bad in ({"drop_event_batches": -1}, {"drop_event_batches": 1.5},
                {"drop_event_batches": "2"}, {"replay_silent": 1}, {"replay_silent": "true"}):
        assert_openai_error(s.client.post("/sim/faults", json=bad), 400)


def test_replay_silent(sim_factory):
    s, _, rep = events_sim(sim_factory, "--replay-silent")
    assert s.client.get("/sim/faults").json()["replay_silent"] is True
    s.chat([{"role": "user", "content": "something to replay " * 20}], max_tokens=1)
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{rep}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert not dealer.poll(700), "a silent replay answered"
        wait_until(lambda: s.stats()["kv_events_replays_ignored"] == 1, 3,
                   what="the ignored replay request was counted")
        assert s.faults(replay_silent=False)["replay_silent"] is False
        got = replay(ctx, rep, 0)
        assert [q for q, _ in got] == [0]
        assert not dealer.poll(200)  # the ignored request is never answered late
        s.faults(replay_silent=True)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert not dealer.poll(500)
        assert s.stats()["kv_events_replays_ignored"] == 2
    finally:
        ctx.destroy(linger=0)
