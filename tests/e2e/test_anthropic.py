"""Anthropic Messages through kvroute (issue 15): POST /v1/messages and
/v1/messages/count_tokens, against kvroute-sim workers (which serve /v1/messages over their chat
template) and stub workers (whose /stub/log shows what reached the worker).

What is checked: a three-turn agent conversation (system prompt, tools, a tool_use and its
tool_result) whose routing text grows by appending, lands on turn 1's worker with a high match
and arrives byte-identical to what the sim wrote (a control sim served the same requests
directly); usage counted from Anthropic's fields (prompt = input + cache read + cache creation,
cached = cache read); completion teaching of Messages replies; session keys from
metadata.user_id and Claude Code's header; count_tokens passed through without teaching;
Anthropic-shaped errors from kvroute itself; anthropic-version/anthropic-beta forwarded and the
client's x-api-key checked and never forwarded; the official @anthropic-ai/sdk npm client.
"""
import json
import os
import shutil
import subprocess

import httpx
import pytest

from conftest import (E2E_DIR, MODEL, SIM_MODEL, SSL_CTX, free_port, header_values, parse_sse,
                      sha256, wait_until)

JS = E2E_DIR / "js"
AV = {"anthropic-version": "2023-06-01"}
KEY = "sk-ant-kvroute-e2e-Zq81"
WRONG = "sk-ant-wrong-Lp02"
BLOCK = 64  # kvroute's default --block-bytes: the prefix index matches whole blocks

SYSTEM = [{"type": "text", "cache_control": {"type": "ephemeral"},
           "text": "You are the weather desk of a travel agency. Answer briefly, cite the tool "
                   "you used, never guess a temperature, and always state the city. " * 12}]
TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city, in Celsius. " * 3,
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                       "units": {"enum": ["C", "F"]}},
                      "required": ["city"]}},
    {"name": "get_forecast", "description": "Forecast for the next days.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                       "days": {"type": "integer"}}},
     "cache_control": {"type": "ephemeral"}},
]


# ============================================================================ helpers
class Admin:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def explain(self, body, headers=None):
        r = httpx.post(self.base + "/debug/route?endpoint=messages", json=body,
                       headers=headers or {}, timeout=5.0, verify=SSL_CTX)
        assert r.status_code == 200, r.text
        return r.json()


def router(kvroute, workers, model=SIM_MODEL, policy="cache_aware", extra=()):
    admin = free_port()
    kv = kvroute(workers, model=model, policy=policy, health_interval_ms=0,
                 extra=["--admin-port", admin] + list(extra))
    return kv, Admin(admin)


def post(url, body, headers=None, timeout=15.0):
    h = dict(AV)
    h.update(headers or {})
    return httpx.post(url + "/v1/messages", json=body, headers=h, timeout=timeout,
                      verify=SSL_CTX)


def body_of(messages, stream=False, **kw):
    b = {"model": SIM_MODEL, "max_tokens": 12, "system": SYSTEM, "tools": TOOLS,
         "messages": messages}
    if stream:
        b["stream"] = True
    b.update(kw)
    return b


def answer_of(r):
    """The answer as one message object, from a JSON body or Anthropic's event stream."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return r.json()
    evs = parse_sse(r.content)
    names = [e["event"] for e in evs]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert names[1] == "content_block_start" and names[-3:-1] == ["content_block_stop",
                                                                  "message_delta"], names
    data = [json.loads(e["data"]) for e in evs]
    assert [d["type"] for d in data] == names, "event names and data types differ"
    msg = data[0]["message"]
    msg["content"] = [{"type": "text", "text": "".join(
        d["delta"]["text"] for d in data if d["type"] == "content_block_delta")}]
    msg["stop_reason"] = data[-2]["delta"]["stop_reason"]
    msg["usage"]["output_tokens"] = data[-2]["usage"]["output_tokens"]
    return msg


def assert_anthropic_error(r, status, etype):
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    obj = r.json()
    assert set(obj) == {"type", "error"} and obj["type"] == "error", obj
    assert set(obj["error"]) == {"type", "message"}, obj
    assert obj["error"]["type"] == etype and obj["error"]["message"], obj
    return obj["error"]


# ============================================================================ the conversation
def test_three_turn_agent_conversation_over_two_sims(sim_factory, kvroute):
    sims = [sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")]
    control = sim_factory("--time-scale", "0")  # serves the same requests directly
    kv, adm = router(kvroute, sims)

    u1 = {"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris?",
                                       "cache_control": {"type": "ephemeral"}}]}
    a1 = {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look that up."},
        {"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
         "input": {"city": "Paris", "units": "C"}}]}
    u2 = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18C, sunny",
         "cache_control": {"type": "ephemeral"}}]}
    turns = [[u1]]
    turns.append([dict(u1, content=u1["content"][:1])] + [a1, u2])
    # turn 3 sends back what the sim answered to turn 2, as a client does
    turns_stream = [False, True, False]

    texts, workers, usage = [], [], []
    prev = None
    for n, stream in enumerate(turns_stream):
        if n == 2:
            reply = answer_of(prev)["content"]
            turns.append(turns[1] + [{"role": "assistant", "content": reply},
                                     {"role": "user", "content": "And tomorrow?"}])
        body = body_of(turns[n], stream=stream)
        ex = adm.explain(body, headers=AV)
        if texts:
            # the previous turn's text (and reply) is known to its worker: a byte prefix of
            # this turn's text, matched up to its last whole block at least
            owner = [w for w in ex["workers"] if w["url"] == workers[0]][0]
            assert ex["routing_text_bytes"] > texts[-1], (ex, texts)
            assert owner["matched_bytes"] >= texts[-1] - (texts[-1] % BLOCK), (owner, texts)
        texts.append(ex["routing_text_bytes"])
        r = post(kv.url, body)
        assert r.status_code == 200, r.text
        direct = post(control.url, body)
        assert direct.status_code == 200, direct.text
        assert r.content == direct.content, \
            "turn %d: kvroute's answer differs from the sim's" % (n + 1)
        want_type = "text/event-stream" if stream else "application/json"
        assert r.headers["content-type"].startswith(want_type), r.headers
        workers.append(r.headers["x-kvroute-worker"])
        if n:
            assert workers[n] == workers[0], (n, workers)
            assert float(r.headers["x-kvroute-match"]) >= 0.9, (n, r.headers)
        msg = answer_of(r)
        assert msg["type"] == "message" and msg["role"] == "assistant", msg
        assert msg["model"] == SIM_MODEL and msg["id"].startswith("msg_"), msg
        assert msg["content"][0]["text"] and msg["stop_reason"] == "max_tokens", msg
        usage.append(msg["usage"])
        prev = r
    # the prompt cache did its work on turns 2 and 3
    assert all(u["cache_read_input_tokens"] > 0 for u in usage[1:]), usage
    owner = workers[0]
    want_cached = sum(u["cache_read_input_tokens"] for u in usage)
    want_prompt = sum(u["input_tokens"] + u["cache_read_input_tokens"]
                      + u["cache_creation_input_tokens"] for u in usage)
    m = kv.metrics()
    assert m.get("kvroute_cached_tokens_total", model=SIM_MODEL, worker=owner) == want_cached
    assert m.get("kvroute_prompt_tokens_total", model=SIM_MODEL, worker=owner) == want_prompt
    assert m.get("kvroute_completion_tokens_total", model=SIM_MODEL, worker=owner) == \
        sum(u["output_tokens"] for u in usage)
    assert m.get("kvroute_requests_total", model=SIM_MODEL, endpoint="/v1/messages",
                 code="200", key="-") == 3


def test_reply_taught_for_the_next_turn(sim_factory, kvroute):
    """Completion teaching: after turn 1, the reply as the client will send it back is
    already known to the worker that wrote it, text and tool_use blocks alike."""
    sims = [sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")]
    kv, adm = router(kvroute, sims)
    for stream in (False, True):
        msgs = [{"role": "user", "content": "Plan a trip to Oslo, streamed=%s" % stream}]
        r = post(kv.url, body_of(msgs, stream=stream))
        assert r.status_code == 200, r.text
        reply = answer_of(r)["content"]
        nxt = body_of(msgs + [{"role": "assistant", "content": reply}])

        def taught():
            ex = adm.explain(nxt)
            row = [w for w in ex["workers"] if w["url"] == r.headers["x-kvroute-worker"]][0]
            return row["matched_bytes"] == ex["routing_text_bytes"]
        wait_until(taught, 3, what="the reply taught to its worker")


# ============================================================================ sessions, counting
def test_session_keys_metadata_user_id_and_claude_code_header(sim_factory, kvroute):
    sims = [sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")]
    kv, _ = router(kvroute, sims)
    seen = {}
    for i in range(4):
        for sess in ("user-a", "user-b"):
            b = body_of([{"role": "user", "content": "unrelated question %d %s" % (i, sess)}],
                        metadata={"user_id": sess})
            r = post(kv.url, b)
            assert r.status_code == 200, r.text
            if i:
                assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
                assert r.headers["x-kvroute-worker"] == seen[sess]
            seen[sess] = r.headers["x-kvroute-worker"]
    # Claude Code's header comes before metadata.user_id
    h = {"x-claude-code-session-id": "cc-1"}
    b = body_of([{"role": "user", "content": "first"}], metadata={"user_id": "user-a"})
    first = post(kv.url, b, headers=h)
    b = body_of([{"role": "user", "content": "second, other text"}], metadata={"user_id": "user-b"})
    second = post(kv.url, b, headers=h)
    assert second.headers["x-kvroute-decision"] == "session_id_match"
    assert second.headers["x-kvroute-worker"] == first.headers["x-kvroute-worker"]


def test_count_tokens_passed_through_and_teaches_nothing(sim_factory, kvroute):
    sim = sim_factory("--time-scale", "0")
    kv, _ = router(kvroute, [sim])
    b = body_of([{"role": "user", "content": "How many tokens is this?"}],
                metadata={"user_id": "counting"})
    b.pop("max_tokens")
    r = httpx.post(kv.url + "/v1/messages/count_tokens", json=b, headers=AV, timeout=10,
                   verify=SSL_CTX)
    direct = httpx.post(sim.url + "/v1/messages/count_tokens", json=b, timeout=10,
                        verify=SSL_CTX)
    assert r.status_code == direct.status_code == 200, (r.text, direct.text)
    assert r.content == direct.content and r.json()["input_tokens"] > 50, r.text
    assert r.headers["x-kvroute-decision"] == "empty_key_min_load", r.headers
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 0
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) == 0
    assert m.get("kvroute_requests_total", model=SIM_MODEL,
                 endpoint="/v1/messages/count_tokens", code="200", key="-") == 1
    # the count matches the prompt /v1/messages then reports (input + cache read)
    b["max_tokens"] = 4
    u = post(kv.url, b).json()["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == r.json()["input_tokens"], u


# ============================================================================ errors
def test_errors_kvroute_answers_have_anthropic_shape(sim_factory, kvroute, tmp_path):
    sim = sim_factory("--time-scale", "0")
    keys = tmp_path / "keys"
    keys.write_text("agent:%s\n" % KEY)
    kv, _ = router(kvroute, [sim], extra=["--api-key-file", keys, "--max-body-bytes", 4096])
    ok = {"x-api-key": KEY}
    good = body_of([{"role": "user", "content": "hi"}], max_tokens=2)
    good["system"] = "short"
    good.pop("tools")
    assert post(kv.url, good, headers=ok).status_code == 200
    assert_anthropic_error(post(kv.url, good), 401, "authentication_error")
    assert_anthropic_error(post(kv.url, good, headers={"x-api-key": WRONG}), 401,
                           "authentication_error")
    assert_anthropic_error(post(kv.url, dict(good, model="nope"), headers=ok), 404,
                           "not_found_error")
    for bad in ({"model": SIM_MODEL}, dict(good, messages=[]), dict(good, system=5),
                dict(good, messages=[{"content": "no role"}]), dict(good, stream="yes")):
        assert_anthropic_error(post(kv.url, bad, headers=ok), 400, "invalid_request_error")
    r = httpx.post(kv.url + "/v1/messages", content=b"{not json", headers=ok, timeout=5,
                   verify=SSL_CTX)
    assert_anthropic_error(r, 400, "invalid_request_error")
    r = httpx.get(kv.url + "/v1/messages", headers=ok, timeout=5, verify=SSL_CTX)
    assert_anthropic_error(r, 405, "invalid_request_error")
    assert r.headers["allow"] == "POST"
    r = httpx.post(kv.url + "/v1/messages/count_tokens", json={"model": "nope", "messages": []},
                   headers=ok, timeout=5, verify=SSL_CTX)
    assert_anthropic_error(r, 400, "invalid_request_error")
    big = dict(good, system="x" * 8000)
    assert_anthropic_error(post(kv.url, big, headers=ok), 413, "request_too_large")
    # the worker's own errors are relayed as it wrote them (the sim answers in Anthropic's
    # shape too)
    r = post(kv.url, dict(good, max_tokens=10 ** 6), headers=ok)
    assert_anthropic_error(r, 400, "invalid_request_error")
    # OpenAI paths keep OpenAI's shape
    r = httpx.post(kv.url + "/v1/chat/completions", json={"model": "nope", "messages": []},
                   headers=ok, timeout=5, verify=SSL_CTX)
    assert r.status_code == 400 and "param" in r.json()["error"], r.text


def test_no_worker_and_midstream_failure(stub, kvroute):
    w = stub()
    kv, _ = router(kvroute, [w], model=MODEL, policy="round_robin", extra=["--max-retries", 0])
    b = {"model": MODEL, "max_tokens": 5, "stream": True,
         "messages": [{"role": "user", "content": "hi"}]}
    r = post(kv.url, b, headers={"x-stub-mode": "sse,drop_after:3"})
    assert r.status_code == 200
    evs = parse_sse(r.content)
    assert [e["event"] for e in evs[:3]] == ["message_start", "content_block_start",
                                             "content_block_delta"], evs
    assert evs[-1]["event"] == "error", evs[-1]
    err = json.loads(evs[-1]["data"])
    assert err["type"] == "error" and err["error"]["type"] == "api_error", err
    w.stop()
    r = post(kv.url, dict(b, stream=False))
    assert r.status_code in (502, 503), r.text
    assert_anthropic_error(r, r.status_code, "api_error" if r.status_code == 502
                           else "overloaded_error")


def test_messages_among_the_other_endpoints(stub, kvroute, tmp_path):
    """Messages beside embeddings, tokenize and the stored-response paths (issue 15, both
    halves): an unknown /v1/messages/... path is kvroute's 404 in Anthropic's shape, never
    forwarded and labelled `other`; /v1/messages keeps its own label; client keys guard it and
    the non-/v1 endpoints alike, x-api-key accepted on both."""
    w = stub()
    keys = tmp_path / "keys"
    keys.write_text("agent:%s\n" % KEY)
    kv, _ = router(kvroute, [w], model=MODEL, policy="round_robin",
                   extra=["--api-key-file", keys])
    ok = {"x-api-key": KEY}
    b = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert post(kv.url, b, headers=ok).status_code == 200
    for method, path in (("POST", "/v1/messages/batches"), ("GET", "/v1/messages/msg_01x"),
                         ("POST", "/v1/messages/count_tokens/x")):
        r = httpx.request(method, kv.url + path, content=b"{}", headers=dict(AV, **ok),
                          timeout=5, verify=SSL_CTX)
        assert_anthropic_error(r, 404, "not_found_error")
    assert_anthropic_error(post(kv.url, b), 401, "authentication_error")
    r = httpx.post(kv.url + "/tokenize", json={"model": MODEL, "prompt": "x"}, timeout=5,
                   verify=SSL_CTX)
    assert r.status_code == 401 and "param" in r.json()["error"], r.text
    r = httpx.post(kv.url + "/tokenize", json={"model": MODEL, "prompt": "x"}, headers=ok,
                   timeout=5, verify=SSL_CTX)
    assert r.headers.get("x-kvroute-worker") == w.url, (r.status_code, r.text)
    assert [e["path"] for e in w.requests(prefix="/v1/messages")] == ["/v1/messages"]
    m = kv.metrics()
    assert m.get("kvroute_requests_total", endpoint="/v1/messages", code="200") == 1
    assert m.get("kvroute_requests_total", endpoint="/v1/messages", code="401") == 1
    assert m.get("kvroute_requests_total", endpoint="other", code="404") == 3
    eps = {lb["endpoint"] for lb, _ in m.find("kvroute_requests_total")}
    assert not any(e.startswith("/v1/messages/") and e != "/v1/messages/count_tokens"
                   for e in eps), eps


# ============================================================================ forwarding
def test_headers_body_and_usage_through_a_stub(stub, kvroute, tmp_path):
    w = stub()
    keys = tmp_path / "keys"
    keys.write_text("agent:%s\n" % KEY)
    kv, _ = router(kvroute, [w], model=MODEL, policy="cache_aware",
                   extra=["--api-key-file", keys])
    h = {"x-api-key": KEY, "anthropic-beta": "prompt-caching-2024-07-31,tools-2024-04-04"}
    raw = json.dumps({"model": MODEL, "max_tokens": 5, "system": "s",
                      "messages": [{"role": "user", "content": "h\u00e9llo"}]}).encode()
    for stream in (False, True):
        body = raw if not stream else raw[:-1] + b', "stream": true}'
        r = httpx.post(kv.url + "/v1/messages", content=body,
                       headers=dict(AV, **h, **{"content-type": "application/json"}),
                       timeout=10, verify=SSL_CTX)
        assert r.status_code == 200, r.text
        e = w.requests(prefix="/v1/messages")[-1]
        assert e["path"] == "/v1/messages" and e["body_sha256"] == sha256(body)
        assert sha256(r.content) == e["resp_body_sha256"], "answer not relayed as written"
        assert header_values(e, "anthropic-version") == ["2023-06-01"], e["headers"]
        assert header_values(e, "anthropic-beta") == [h["anthropic-beta"]], e["headers"]
        assert header_values(e, "x-api-key") == [] and header_values(e, "authorization") == []
        assert KEY not in json.dumps(e["headers"])
        assert answer_of(r)["content"][0]["text"] == "tok0 tok1 tok2 tok3 tok4 "
    m = kv.metrics()
    prompt = len(raw) // 4  # the stub reports body bytes / 4 as input_tokens
    assert m.get("kvroute_completion_tokens_total", model=MODEL, worker=w.url) == 10
    assert m.get("kvroute_cached_tokens_total", model=MODEL, worker=w.url) == 0
    assert m.get("kvroute_prompt_tokens_total", model=MODEL, worker=w.url) == \
        prompt + (len(raw) + 16) // 4
    assert m.get("kvroute_requests_total", model=MODEL, endpoint="/v1/messages", code="200",
                 key="agent") == 2


# ============================================================================ the npm client
def run_node_client(*args):
    """Runs tests/e2e/js/anthropic_client.mjs; returns its steps by name. Skipped (never failed)
    when node or the pinned @anthropic-ai/sdk is not installed."""
    node = shutil.which("node")
    if not node:
        pytest.skip("node not installed (scripts/install-deps.sh installs nodejs)")
    if not (JS / "node_modules" / "@anthropic-ai" / "sdk").is_dir():
        pytest.skip("@anthropic-ai/sdk npm package not installed: run scripts/install-deps.sh "
                    "(npm ci in tests/e2e/js)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    try:
        p = subprocess.run([node, str(JS / "anthropic_client.mjs")] + [str(a) for a in args],
                           cwd=str(JS), capture_output=True, timeout=60, text=True, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("anthropic client did not finish within 60 s")
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    assert p.returncode == 0, "anthropic client failed: %r; stderr: %s" % (lines[-1:],
                                                                          p.stderr[-2000:])
    return {o["step"]: o for o in lines}


def test_anthropic_sdk_node_client(stub, kvroute, tmp_path):
    w = stub()
    keys = tmp_path / "keys"
    keys.write_text("sdk:%s\n" % KEY)
    kv, _ = router(kvroute, [w], model=MODEL, policy="cache_aware",
                   extra=["--api-key-file", keys])
    steps = run_node_client(kv.url, MODEL, KEY, WRONG)
    text = "tok0 tok1 tok2 tok3 tok4 "
    msg = steps["message"]
    assert msg["type"] == "message" and msg["text"] == text, msg
    assert msg["stop_reason"] == "end_turn" and msg["usage"]["output_tokens"] == 5, msg
    assert msg["worker"] == w.url and msg["request_id"], msg
    st = steps["stream"]
    assert st["text"] == text and st["stop_reason"] == "end_turn", st
    assert st["events"][0] == "message_start" and st["events"][-1] == "message_stop", st
    assert st["usage"]["output_tokens"] == 5 and st["worker"] == w.url, st
    hs = steps["stream_helper"]
    assert hs["text"] == hs["final_text"] == text and hs["usage"]["output_tokens"] == 5, hs
    assert steps["count_tokens"]["input_tokens"] > 0
    bad = steps["bad_key"]
    assert bad == {"step": "bad_key", "status": 401, "class": "AuthenticationError",
                   "error_type": "authentication_error", "body_type": "error"}, bad

    reqs = w.requests(prefix="/v1/messages")
    assert [e["path"] for e in reqs] == ["/v1/messages"] * 3 + ["/v1/messages/count_tokens"]
    assert [e["stream"] for e in reqs[:3]] == [False, True, True]
    for e in reqs:
        assert header_values(e, "x-api-key") == [] and header_values(e, "authorization") == []
        assert KEY not in json.dumps(e["headers"]) and WRONG not in json.dumps(e["headers"])
        assert header_values(e, "anthropic-version"), e["headers"]
    m = kv.metrics()
    assert m.get("kvroute_requests_total", model=MODEL, endpoint="/v1/messages", code="200",
                 key="sdk") == 3
    assert m.get("kvroute_auth_failures_total", reason="invalid") == 1


def test_anthropic_sdk_node_client_over_sims(sim_factory, kvroute, tmp_path):
    """The SDK against kvroute-sim workers: its own key (the script's default), the model
    from /v1/models, and the usage of its three answers counted by kvroute."""
    sims = [sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")]
    keys = tmp_path / "keys"
    keys.write_text("node:sk-kvroute-e2e\n")
    kv, _ = router(kvroute, sims, extra=["--api-key-file", keys])
    steps = run_node_client(kv.url + "/v1")
    assert steps["models"]["ids"] == [SIM_MODEL], steps["models"]
    usages = [steps["message"]["usage"], steps["stream"]["usage"],
              steps["stream_helper"]["usage"]]
    assert steps["stream"]["stop_reason"] == steps["stream_helper"]["stop_reason"] == "max_tokens"
    assert steps["stream"]["text"] and steps["stream_helper"]["text"], steps
    m = kv.metrics()
    total = lambda name: sum(v for _, v in m.find(name))  # noqa: E731
    assert total("kvroute_cached_tokens_total") == sum(u["cache_read_input_tokens"]
                                                       for u in usages)
    assert total("kvroute_prompt_tokens_total") == sum(
        u["input_tokens"] + u["cache_read_input_tokens"] for u in usages)
    assert total("kvroute_completion_tokens_total") == sum(u["output_tokens"] for u in usages)
