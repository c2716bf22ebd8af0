"""Prefill/decode disaggregation (issue 21, the router's part): routes whose targets include
prefill-role workers (--prefill URL, --decode URL, `role:` in the file) run each chat or
completions request as a prefill call and a decode call.

vLLM mode (NixlConnector, sequential): the prefill worker gets a max_tokens 1, non-streaming
copy asking for a remote decode; its answer's kv_transfer_params go with the original request
to the decode worker, whose answer the client receives. SGLang mode (bootstrap): both get the
request with the same bootstrap_host/port/room at the same time.

Stub workers (tests/e2e/stub_worker.py, an emulated NixlConnector) show exactly what each
worker received; kvroute-sim workers (--role) where a real engine's cache matters. Every wait is
bounded; each test takes a few seconds.
"""
import hashlib
import json
import shutil
import subprocess
import time

import httpx
import pytest

from conftest import (E2E_DIR, KVROUTE_BIN, MODEL, chat_body, free_port, header_value,
                      parse_sse, wait_until)

NIXL_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}


def pd_kvroute(kvroute, prefill, decode, extra=(), **kw):
    argv = []
    for w in prefill:
        argv += ["--prefill", w.url]
    for w in decode:
        argv += ["--decode", w.url]
    kw.setdefault("health_interval_ms", 0)
    kw.setdefault("policy", None)
    return kvroute([], extra=argv + list(extra), **kw)


def calls(workers):
    """{worker url: [logged chat/completions requests]}"""
    return {w.url: [e for e in w.proxied()] for w in workers}


def one_call(workers):
    """The only request any of `workers` received, and its worker."""
    got = [(w, e) for w in workers for e in w.proxied()]
    assert len(got) == 1, "expected exactly one call, got %r" % [(w.url, e["seq"]) for w, e in got]
    return got[0]


# ============================================================================ vLLM mode
def test_vllm_json_one_prefill_one_decode(stub, kvroute, tmp_path):
    ps, ds = [stub(), stub()], [stub(), stub()]
    alog = tmp_path / "access.log"
    kv = pd_kvroute(kvroute, ps, ds, extra=["--access-log", str(alog)])
    body = chat_body(content="tell me a story", max_tokens=50, min_tokens=3,
                     stream_options={"include_usage": True})
    r = kv.post("/v1/chat/completions", body, headers={"x-request-id": "pd-req-1"})
    assert r.status_code == 200, r.text
    pw, pe = one_call(ps)
    dw, de = one_call(ds)
    pb, db = pe["body_json"], de["body_json"]
    # the prefill copy
    assert pb["max_tokens"] == 1 and pb["stream"] is False
    assert pb["kv_transfer_params"] == NIXL_PREFILL
    for k in ("stream_options", "min_tokens"):
        assert k not in pb
    assert pb["messages"] == body["messages"]
    # the decode call: the original plus the prefill's kv_transfer_params
    assert db["kv_transfer_params"]["remote_engine_id"] == pw.name
    assert db["kv_transfer_params"]["do_remote_prefill"] is True
    assert {k: v for k, v in db.items() if k != "kv_transfer_params"} == body
    # the client gets the decode's answer, with both workers named
    assert r.headers["x-kvroute-worker"] == dw.url
    assert r.headers["x-kvroute-prefill-worker"] == pw.url
    assert r.headers["x-request-id"] == "pd-req-1"
    assert header_value(pe, "x-request-id") == header_value(de, "x-request-id") == "pd-req-1"
    assert r.json()["system_fingerprint"] == dw.name
    assert "kv_transfer_params" not in r.json()
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=MODEL, result="ok") == 1
    assert m.get("kvroute_pd_prefill_seconds_count", model=MODEL) == 1
    # the prefill's prompt tokens count under the prefill worker, the decode's completion
    assert m.get("kvroute_prompt_tokens_total", model=MODEL, worker=pw.url) > 0
    assert not m.get("kvroute_prompt_tokens_total", model=MODEL, worker=dw.url)
    assert m.get("kvroute_completion_tokens_total", model=MODEL, worker=dw.url) == 5
    kv.stop()
    line = json.loads(alog.read_text().splitlines()[-1])
    assert line["worker"] == dw.url and line["prefill_worker"] == pw.url


def test_vllm_body_bytes_otherwise_identical(stub, kvroute):
    """The decode body is the client's bytes with one member appended; the prefill copy keeps
    every other member's bytes (spacing included)."""
    ps, ds = [stub()], [stub()]
    kv = pd_kvroute(kvroute, ps, ds)
    raw = (b'{ "model" : "%s", "messages": [ {"role":"user", "content":"x  y"} ],\n'
           b' "max_completion_tokens": 9, "stream":false }' % MODEL.encode())
    r = kv.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200, r.text
    pe, de = ps[0].proxied()[0], ds[0].proxied()[0]
    assert pe["body_json"]["max_completion_tokens"] == 1 and pe["body_json"]["max_tokens"] == 1
    kvtp = json.dumps(de["body_json"]["kv_transfer_params"], separators=(",", ":"))
    want = raw[:-2] + b',"kv_transfer_params":' + kvtp.encode() + b" }"
    assert de["body_len"] == len(want)
    assert de["body_json"] == json.loads(want)


def test_vllm_stream_reaches_client_intact(stub, kvroute):
    ps, ds = [stub(), stub()], [stub(), stub()]
    kv = pd_kvroute(kvroute, ps, ds)
    body = chat_body(content="stream please", stream=True, stream_options={"include_usage": True})
    r = kv.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    pw, pe = one_call(ps)
    dw, de = one_call(ds)
    assert pe["body_json"]["stream"] is False and "stream_options" not in pe["body_json"]
    assert de["body_json"]["stream"] is True
    assert de["body_json"]["stream_options"] == {"include_usage": True}
    assert r.content and hashlib.sha256(r.content).hexdigest() == de["resp_body_sha256"]
    events = parse_sse(r.content)
    assert events[-1]["data"] == "[DONE]"


def test_vllm_turn2_same_prefill_worker(stub, kvroute):
    ps, ds = [stub(), stub()], [stub(), stub()]
    kv = pd_kvroute(kvroute, ps, ds)
    msgs = [{"role": "system", "content": "You are a helpful assistant. " * 40},
            {"role": "user", "content": "first question about the weather"}]
    r1 = kv.post("/v1/chat/completions", {"model": MODEL, "messages": msgs})
    assert r1.status_code == 200, r1.text
    first = r1.headers["x-kvroute-prefill-worker"]
    msgs2 = msgs + [r1.json()["choices"][0]["message"],
                    {"role": "user", "content": "and tomorrow?"}]
    for _ in range(3):
        r2 = kv.post("/v1/chat/completions", {"model": MODEL, "messages": msgs2})
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-kvroute-prefill-worker"] == first
        assert r2.headers["x-kvroute-decision"] == "prefix_match"


def test_vllm_prefill_killed_retries_other_then_local(stub, kvroute):
    ps, ds = [stub(), stub()], [stub(), stub()]
    kv = pd_kvroute(kvroute, ps, ds, extra=["--breaker-failures", "0"])
    ps[0].kill()
    for i in range(4):
        r = kv.post("/v1/chat/completions", chat_body(content="q%d" % i))
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-prefill-worker"] == ps[1].url
    ps[1].kill()
    for i in range(3):
        r = kv.post("/v1/chat/completions", chat_body(content="local %d" % i, stream=i % 2 == 1))
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
        assert r.headers["x-kvroute-worker"] in (ds[0].url, ds[1].url)
        assert "x-kvroute-prefill-worker" not in r.headers
    # a local prefill is the original request: no kv_transfer_params
    for e in ds[0].proxied() + ds[1].proxied():
        if e["body_json"]["messages"][0]["content"].startswith("local"):
            assert "kv_transfer_params" not in e["body_json"]
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=MODEL, result="local_prefill") == 3
    assert sum(v for lb, v in m.find("kvroute_pd_fallbacks_total")) == 3


def test_vllm_prefill_without_kv_transfer_params_is_a_failure(stub, kvroute):
    ps, ds = [stub(), stub()], [stub()]
    ps[0].config(kv_transfer_params=None)
    kv = pd_kvroute(kvroute, ps, ds)
    for i in range(4):
        r = kv.post("/v1/chat/completions", chat_body(content="n%d" % i))
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-prefill-worker"] == ps[1].url
    ps[1].config(kv_transfer_params=None)
    r = kv.post("/v1/chat/completions", chat_body(content="none left"))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
    m = kv.metrics()
    assert m.get("kvroute_pd_fallbacks_total", model=MODEL, reason="no_kv_transfer_params") >= 1


def test_vllm_prefill_5xx_retried(stub, kvroute):
    ps, ds = [stub(), stub()], [stub()]
    ps[0].config(mode="fail:503")
    kv = pd_kvroute(kvroute, ps, ds)
    for i in range(3):
        r = kv.post("/v1/chat/completions", chat_body(content="f%d" % i))
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-prefill-worker"] == ps[1].url


def test_vllm_prefill_answer_over_the_bound(stub, kvroute):
    ps, ds = [stub()], [stub()]
    ps[0].config(kv_transfer_params={"do_remote_prefill": True,
                                     "remote_block_ids": list(range(3000))})
    kv = pd_kvroute(kvroute, ps, ds, extra=["--pd-max-prefill-bytes", "4096"])
    r = kv.post("/v1/chat/completions", chat_body(content="big"))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
    assert kv.metrics().get("kvroute_pd_fallbacks_total", model=MODEL, reason="too_large") == 1


def test_vllm_prefill_4xx_not_retried(stub, kvroute):
    """A 4xx says the request is wrong, not the worker: no other prefill worker is tried; the
    decode worker gets the request as it is and its answer is the client's."""
    ps, ds = [stub(), stub()], [stub()]
    for p in ps:
        p.config(mode="fail:400")
    kv = pd_kvroute(kvroute, ps, ds)
    r = kv.post("/v1/chat/completions", chat_body(content="bad"))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
    assert len(ps[0].proxied()) + len(ps[1].proxied()) == 1
    m = kv.metrics()
    assert m.get("kvroute_pd_fallbacks_total", model=MODEL, reason="http_400") == 1


def test_vllm_decode_failure_retried_with_same_params(stub, kvroute):
    ps, ds = [stub()], [stub(), stub()]
    ds[0].config(mode="fail:503")
    kv = pd_kvroute(kvroute, ps, ds, extra=["--breaker-failures", "0"])
    for i in range(8):
        r = kv.post("/v1/chat/completions", chat_body(content="decode retry %d" % i))
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-worker"] == ds[1].url
    assert len(ps[0].proxied()) == 8  # a decode retry prefills nothing again
    ok = {header_value(e, "x-request-id"): e["body_json"]["kv_transfer_params"]
          for e in ds[1].proxied()}
    failed = ds[0].proxied()
    assert failed, "no request tried the failing decode worker first"
    for e in failed:
        assert e["body_json"]["kv_transfer_params"] == ok[header_value(e, "x-request-id")]


def test_vllm_client_gone_during_prefill(stub, kvroute):
    """A client that leaves while its prefill runs: the prefill call is cancelled (the worker
    sees the disconnect), no decode call is made, nothing stays in flight."""
    ps, ds = [stub()], [stub()]
    ps[0].config(mode="delay:3000")
    kv = pd_kvroute(kvroute, ps, ds)
    with pytest.raises(httpx.TimeoutException):
        kv.post("/v1/chat/completions", chat_body(content="bye"), timeout=0.5)
    wait_until(lambda: ps[0].proxied() and ps[0].proxied()[0]["client_gone"], 5,
         what="the prefill worker saw kvroute go")
    assert ds[0].proxied() == []
    kv.wait_inflight_zero()
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=MODEL, result="error") == 1


def test_completions_and_debug_route(stub, kvroute):
    ps, ds = [stub()], [stub()]
    admin = free_port()
    kv = pd_kvroute(kvroute, ps, ds, extra=["--admin-port", str(admin)],
                    health_interval_ms=200)  # a worker found gone is unhealthy at once
    r = kv.post("/v1/completions", {"model": MODEL, "prompt": "once", "max_tokens": 7})
    assert r.status_code == 200, r.text
    assert ps[0].proxied()[0]["body_json"]["max_tokens"] == 1
    assert ds[0].proxied()[0]["body_json"]["max_tokens"] == 7
    d = httpx.post("http://127.0.0.1:%d/debug/route" % admin,
                   json={"model": MODEL, "prompt": "once"}, timeout=5.0).json()
    assert d["pd"]["prefill"]["worker"] == ps[0].url
    assert d["pd"]["decode"]["worker"] == ds[0].url
    assert d["worker"] == ps[0].url
    ps[0].kill()  # no prefill worker left: the request would prefill on the decode worker
    r = kv.post("/v1/completions", {"model": MODEL, "prompt": "once", "max_tokens": 7})
    assert r.status_code == 200 and r.headers["x-kvroute-decision"] == "pd_local_prefill"
    d = httpx.post("http://127.0.0.1:%d/debug/route" % admin,
                   json={"model": MODEL, "prompt": "once"}, timeout=5.0).json()
    assert d["decision"] == "pd_local_prefill" and d["worker"] == ds[0].url and "pd" not in d
    rt = httpx.get("http://127.0.0.1:%d/routes" % admin, timeout=5.0).json()["routes"][0]
    assert rt["pd"] == {"mode": "vllm", "prefill_policy": "cache_aware",
                        "decode_policy": "least_load"}
    assert {t["url"]: t["role"] for t in rt["targets"]} == {ps[0].url: "prefill",
                                                           ds[0].url: "decode"}


def test_non_generating_endpoint_skips_prefill(stub, kvroute):
    ps, ds = [stub()], [stub()]
    kv = pd_kvroute(kvroute, ps, ds)
    r = kv.post("/v1/messages/count_tokens", {"model": MODEL, "messages": [
        {"role": "user", "content": "hi"}]}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    assert ps[0].proxied() == [] or all(e["path"] != "/v1/messages/count_tokens"
                                        for e in ps[0].requests())


def test_vllm_openai_node_client(stub, kvroute):
    """The official openai@6 client, plain and streamed, through a disaggregated route."""
    node = shutil.which("node")
    js = E2E_DIR / "js"
    assert node and (js / "node_modules" / "openai").is_dir(), "node or openai@6 missing"
    ps, ds = [stub()], [stub()]
    kv = pd_kvroute(kvroute, ps, ds)
    p = subprocess.run([node, str(js / "openai_client.mjs"), kv.url + "/v1", MODEL],
                       cwd=str(js), capture_output=True, timeout=60, text=True)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    steps = {o["step"]: o for o in lines}
    assert p.returncode == 0, "openai client failed: %r; %s" % (lines[-1:], p.stderr[-2000:])
    for step in ("chat", "stream"):
        assert steps[step]["content"] == "tok0 tok1 tok2 tok3 tok4 ", steps[step]
        assert steps[step]["finish_reason"] == "stop"
        assert steps[step]["usage"]["completion_tokens"] == 5
    assert steps["chat"]["worker"] == ds[0].url
    pre, dec = ps[0].proxied(), ds[0].proxied()
    assert len(pre) == 2 and len(dec) == 2
    assert all(e["body_json"]["max_tokens"] == 1 and e["body_json"]["stream"] is False
               for e in pre)
    assert dec[1]["stream"] is True and "kv_transfer_params" in dec[1]["body_json"]


def test_vllm_config_file_worker_keys(stub, kvroute, tmp_path):
    """Each call carries its own worker's key (never the client's), and the prefill worker gets
    its target's upstream model name."""
    p, d = stub(model="up-p"), stub(model="up-d")
    (tmp_path / "p.key").write_text("prefill-secret\n")
    (tmp_path / "d.key").write_text("decode-secret\n")
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""
workers:
  - {url: "%s", name: p0, role: prefill, api_key_file: "%s"}
  - {url: "%s", name: d0, role: decode, api_key_file: "%s"}
routes:
  - name: pub
    targets: [{worker: p0, model: up-p}, {worker: d0, model: up-d}]
""" % (p.url, tmp_path / "p.key", d.url, tmp_path / "d.key"))
    kv = kvroute([], model=None, policy=None, health_interval_ms=0,
                 extra=["--config", str(cfg)])
    r = kv.post("/v1/chat/completions", chat_body(model="pub"),
                headers={"authorization": "Bearer client-key"})
    assert r.status_code == 200, r.text
    pe, de = p.proxied()[0], d.proxied()[0]
    assert header_value(pe, "authorization") == "Bearer prefill-secret"
    assert header_value(de, "authorization") == "Bearer decode-secret"
    assert pe["body_json"]["model"] == "up-p" and de["body_json"]["model"] == "up-d"


def test_prefill_worker_added_at_run_time(stub, kvroute):
    """POST /workers with role prefill makes the route disaggregated; removing it makes the
    route ordinary again."""
    p, d = stub(), stub()
    admin = free_port()
    kv = pd_kvroute(kvroute, [], [d], extra=["--admin-port", str(admin)])
    base = "http://127.0.0.1:%d" % admin
    r = kv.post("/v1/chat/completions", chat_body(content="before"))
    assert r.status_code == 200 and "x-kvroute-prefill-worker" not in r.headers
    a = httpx.post(base + "/workers", json={"url": p.url, "name": "p0", "role": "prefill",
                                            "bootstrap_port": 9100}, timeout=5.0)
    assert a.status_code == 201, a.text
    assert a.json()["role"] == "prefill" and a.json()["bootstrap_port"] == 9100
    r = kv.post("/v1/chat/completions", chat_body(content="after"))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-prefill-worker"] == p.url
    assert p.proxied()[0]["body_json"]["max_tokens"] == 1
    bad = httpx.post(base + "/workers", json={"url": "http://127.0.0.1:1", "role": "prefill",
                                              "bootstrap_port": 0}, timeout=5.0)
    assert bad.status_code == 400 and "bootstrap_port" in bad.text
    assert httpx.delete(base + "/workers/p0", timeout=5.0).status_code in (200, 204)
    r = kv.post("/v1/chat/completions", chat_body(content="gone"))
    assert r.status_code == 200 and "x-kvroute-prefill-worker" not in r.headers


def test_stalled_prefill_times_out_then_retries_then_local(stub, kvroute):
    """A prefill worker that never answers (a stopped engine) holds a request only for
    --pd-prefill-timeout-ms: the other prefill worker is tried, then a local prefill."""
    ps, ds = [stub(), stub()], [stub()]
    for p in ps:
        p.config(mode="hang")
    kv = pd_kvroute(kvroute, ps, ds, extra=["--pd-prefill-timeout-ms", "300"])
    t0 = time.monotonic()
    r = kv.post("/v1/chat/completions", chat_body(content="stalled prefill"))
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
    assert r.headers["x-kvroute-attempts"] == "3"  # two prefill attempts, then the local one
    assert took < 5, took
    assert len(ps[0].proxied()) + len(ps[1].proxied()) == 2
    m = kv.metrics()
    assert m.get("kvroute_pd_fallbacks_total", model=MODEL, reason="prefill_timeout") == 1
    assert m.get("kvroute_upstream_errors_total", worker=ps[0].url, kind="prefill_timeout") == 1


def test_no_decode_worker_eligible_makes_no_prefill(stub, kvroute):
    """With every decode worker drained nothing could use a prefill: the client gets 503 at
    once and no prefill worker computes (and holds) the prompt's KV."""
    p, d = stub(), stub()
    admin = free_port()
    kv = pd_kvroute(kvroute, [p], [d], extra=["--admin-port", str(admin)])
    base = "http://127.0.0.1:%d" % admin
    r = httpx.post(base + "/workers/%s/drain" % d.url.replace(":", "%3A").replace("/", "%2F"),
                   timeout=5.0)
    assert r.status_code == 200, r.text
    r = kv.post("/v1/chat/completions", chat_body(content="nowhere to decode"))
    assert r.status_code == 503, r.text
    assert p.proxied() == [] and d.proxied() == []
    # not ready either: the prefill worker still eligible serves nothing alone
    r = kv.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "not_ready", r.text
    assert r.json()["eligible_workers"] == 1, r.text


# ============================================================================ SGLang mode
def sglang_pair(kvroute, tmp_path, p, d):
    """kvroute with one SGLang route: prefill stub p (bootstrap port 9123), decode stub d."""
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""
workers:
  - {url: "%s", name: p0, role: prefill, bootstrap_port: 9123}
  - {url: "%s", name: d0, role: decode}
routes:
  - name: %s
    pd: {mode: sglang}
    targets: [p0, d0]
""" % (p.url, d.url, MODEL))
    return kvroute([], model=None, policy=None, health_interval_ms=0,
                   extra=["--config", str(cfg)])


def test_sglang_same_room_concurrent(stub, kvroute, tmp_path):
    p, d = stub(), stub()
    kv = sglang_pair(kvroute, tmp_path, p, d)
    for stream in (False, True):
        p.reset()
        d.reset()
        r = kv.post("/v1/chat/completions", chat_body(content="sg", stream=stream),
                    headers={"x-stub-mode": "delay:300"})
        assert r.status_code == 200, r.text
        # the client's answer is the decode worker's; the prefill worker's own answer may
        # still be on its way (a loaded machine started it later), so wait for it
        pe = wait_until(lambda: p.proxied()[0]["t_headers_sent"] is not None and p.proxied()[0],
                        5, what="the prefill worker's answer")
        de = d.proxied()[0]
        pb, db = pe["body_json"], de["body_json"]
        assert pb["bootstrap_room"] == db["bootstrap_room"]
        assert 0 <= pb["bootstrap_room"] < 2 ** 63
        assert pb["bootstrap_host"] == db["bootstrap_host"] == "127.0.0.1"
        assert pb["bootstrap_port"] == db["bootstrap_port"] == 9123
        # concurrent: each arrived before the other answered
        assert pe["t_start"] < de["t_headers_sent"] and de["t_start"] < pe["t_headers_sent"]
        assert r.headers["x-kvroute-worker"] == d.url
        assert r.headers["x-kvroute-prefill-worker"] == p.url
        assert r.headers["x-kvroute-attempts"] == "2", (stream, r.headers)
        assert hashlib.sha256(r.content).hexdigest() == de["resp_body_sha256"]
    # the prefill worker gone: the decode call waiting for its room is replaced by a local
    # prefill (the original request, no bootstrap) on a decode worker
    p.kill()
    d.reset()
    r = kv.post("/v1/chat/completions", chat_body(content="sg alone"),
                headers={"x-stub-mode": "delay:300"})
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
    assert r.headers["x-kvroute-worker"] == d.url
    last = d.proxied()[-1]["body_json"]
    assert "bootstrap_room" not in last and last["messages"][0]["content"] == "sg alone"


def test_sglang_decode_done_first_lets_the_prefill_finish(stub, kvroute, tmp_path):
    """The decode's whole answer relayed before the prefill's own arrives (a short answer: the
    engine's prefill answers after its KV transfer): the prefill call is not cancelled with the
    request; it ends alone, so its usage counts and its worker is not told to abort."""
    p, d = stub(), stub()
    p.config(mode="delay:700")
    kv = sglang_pair(kvroute, tmp_path, p, d)
    r = kv.post("/v1/chat/completions", chat_body(content="decode first"))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-worker"] == d.url
    assert r.headers["x-kvroute-attempts"] == "2"  # the prefill counts, though still running
    assert p.proxied() and p.proxied()[0]["t_headers_sent"] is None  # still in its delay
    pe = wait_until(lambda: p.proxied()[0].get("ended") == "complete" and p.proxied()[0], 5,
                    what="the prefill worker's whole answer")
    assert pe["status"] == 200
    wait_until(lambda: (kv.metrics().get("kvroute_prompt_tokens_total", model=MODEL,
                                         worker=p.url) or 0) > 0, 3,
               what="the prefill's usage counted")
    assert kv.metrics().get("kvroute_pd_requests_total", model=MODEL, result="ok") == 1
    # stopped while such a prefill is still in flight: it is cancelled, and kvroute exits cleanly
    p.reset()
    r = kv.post("/v1/chat/completions", chat_body(content="decode first again"))
    assert r.status_code == 200, r.text
    assert p.proxied()[0]["t_headers_sent"] is None
    kv.stop()
    assert kv.proc.returncode() == 0, kv.proc.stderr_text(tail=20)
    wait_until(lambda: p.proxied()[0].get("ended") == "client_gone", 3,
               what="the prefill worker told the request is gone")


def test_sglang_prefill_failure_restarts_the_pair(stub, kvroute, tmp_path):
    """A prefill worker gone: the decode call waiting for its room is cancelled and the pair
    starts again on the other prefill worker with a new room."""
    ps, d = [stub(), stub()], stub()
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""
workers:
  - {url: "%s", role: prefill}
  - {url: "%s", role: prefill}
  - {url: "%s", role: decode}
routes:
  - name: %s
    pd: {mode: sglang}
    targets: ["%s", "%s", "%s"]
""" % (ps[0].url, ps[1].url, d.url, MODEL, ps[0].url, ps[1].url, d.url))
    kv = kvroute([], model=None, policy=None, health_interval_ms=0,
                 extra=["--config", str(cfg), "--breaker-failures", "0"])
    ps[0].kill()
    for i in range(8):
        r = kv.post("/v1/chat/completions", chat_body(content="pair %d" % i),
                    headers={"x-stub-mode": "delay:200", "x-session-id": "s%d" % i})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-prefill-worker"] == ps[1].url
        # the answer's decode call carried the room the live prefill worker got
        rooms = {e["body_json"]["bootstrap_room"] for e in ps[1].proxied()
                 if e["body_json"]["messages"][0]["content"] == "pair %d" % i}
        last = [e for e in d.proxied() if e["body_json"]["messages"][0]["content"] ==
                "pair %d" % i][-1]
        assert rooms == {last["body_json"]["bootstrap_room"]}
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=MODEL, result="ok") == 8
    assert sum(v for lb, v in m.find("kvroute_retries_total")) >= 1, "never tried the dead one"


# ============================================================================ configuration
def test_check_refuses_prefill_without_decode(stub, tmp_path):
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""
workers:
  - {url: "http://127.0.0.1:1", name: p0, role: prefill}
routes:
  - name: m
    targets: [p0]
""")
    out = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0
    assert "no decode" in out.stderr + out.stdout
    out = subprocess.run([str(KVROUTE_BIN), "--check", "--prefill", "http://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0
    cfg.write_text("""
workers:
  - {url: "http://127.0.0.1:1", name: p0, role: prefill}
  - {url: "http://127.0.0.1:2", name: d0, role: decode}
routes:
  - name: m
    pd: {mode: nixl}
    targets: [p0, d0]
""")
    out = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0 and "nixl" in out.stderr + out.stdout


# ============================================================================ kvroute-sim fleets
from conftest import SIM_MODEL  # noqa: E402

SIM_SYSTEM = {"role": "system", "content": "You answer questions about caches briefly. " * 8}


def sim_log(sim):
    r = sim.client.get("/sim/requests")
    assert r.status_code == 200, r.text
    return r.json()


def sim_fleet(sim_factory, np, nd, *extra):
    ps = [sim_factory("--time-scale", "0", "--role", "prefill", *extra) for _ in range(np)]
    ds = [sim_factory("--time-scale", "0", "--role", "decode", *extra) for _ in range(nd)]
    return ps, ds


def sim_chat(kv, text, stream=False, history=(), rid=None, **extra):
    body = {"model": SIM_MODEL, "max_tokens": 8, "stream": stream,
            "messages": [SIM_SYSTEM, *history, {"role": "user", "content": text}],
            **{k: v for k, v in extra.items() if v is not None}}
    return kv.post("/v1/chat/completions", body, headers={"x-request-id": rid} if rid else None)


def test_sim_vllm_2p2d(sim_factory, kvroute):
    ps, ds = sim_fleet(sim_factory, 2, 2)
    kv = pd_kvroute(kvroute, ps, ds, model=SIM_MODEL)
    r = sim_chat(kv, "What is a KV cache block?", rid="sim-pd-1")
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    pre = [(p, e) for p in ps for e in sim_log(p)]
    dec = [(d, e) for d in ds for e in sim_log(d)]
    assert len(pre) == 1 and len(dec) == 1
    (pw, pe), (dw, de) = pre[0], dec[0]
    assert pe["request_id"] == de["request_id"] == "sim-pd-1"
    assert pe["pd"] == "prefill" and pe["max_tokens"] == 1 and pe["stream"] is False
    assert pe["kv_transfer_params"]["do_remote_decode"] is True
    assert de["pd"] == "decode" and de["max_tokens"] == 8
    assert de["kv_transfer_params"]["remote_port"] == pw.port
    assert de["kv_transfer"]["result"] == "fetched" and de["kv_transfer"]["recomputed"] is False
    assert r.headers["x-kvroute-prefill-worker"] == pw.url
    assert r.headers["x-kvroute-worker"] == dw.url
    # the decode's cached tokens are the transferred blocks: nothing recomputed
    u = r.json()["usage"]
    assert u["prompt_tokens_details"]["cached_tokens"] == \
        min(de["kv_transfer"]["blocks"], (u["prompt_tokens"] - 1) // 16) * 16 > 0
    assert dw.metrics().get("kvroute_sim:kv_recomputed_requests_total") == 0

    # streamed, then turn 2 of the conversation on turn 1's prefill worker
    r = sim_chat(kv, "Why hold blocks?", stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200, r.text
    ev = parse_sse(r.content)
    assert ev[-1]["data"] == "[DONE]"
    chunks = [json.loads(e["data"]) for e in ev[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices")) != ""
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    first = r.headers["x-kvroute-prefill-worker"]
    reply = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                    if c.get("choices"))
    hist = [{"role": "user", "content": "Why hold blocks?"},
            {"role": "assistant", "content": reply}]
    for i in range(3):
        r2 = sim_chat(kv, "And then %d?" % i, history=hist)
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-kvroute-prefill-worker"] == first
        assert r2.headers["x-kvroute-decision"] == "prefix_match"
    for d in ds:
        assert d.metrics().get("kvroute_sim:kv_recomputed_requests_total") == 0
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=SIM_MODEL, result="ok") == 5
    # prompt tokens count where they were prefilled
    assert sum(m.get("kvroute_prompt_tokens_total", model=SIM_MODEL, worker=d.url) or 0
               for d in ds) == 0


def test_sim_prefill_killed(sim_factory, kvroute):
    ps, ds = sim_fleet(sim_factory, 2, 2)
    kv = pd_kvroute(kvroute, ps, ds, model=SIM_MODEL, extra=["--breaker-failures", "0"])
    ps[0].stop()  # gone (SIGTERM: the teardown wants a clean exit)
    for i in range(4):
        r = sim_chat(kv, "killed one %d" % i, stream=i % 2 == 1)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-prefill-worker"] == ps[1].url
    ps[1].stop()
    for i in range(4):
        r = sim_chat(kv, "killed both %d" % i, stream=i % 2 == 1)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-decision"] == "pd_local_prefill"
        assert r.headers["x-kvroute-worker"] in (ds[0].url, ds[1].url)
    local = [e for d in ds for e in sim_log(d) if "killed both" in json.dumps(e)
             or e.get("kv_transfer_params") is None]
    assert all(e.get("kv_transfer_params") is None for e in local)
    m = kv.metrics()
    assert m.get("kvroute_pd_requests_total", model=SIM_MODEL, result="local_prefill") == 4
    assert m.get("kvroute_pd_requests_total", model=SIM_MODEL, result="ok") == 4


def test_sim_sglang_bootstrap(sim_factory, kvroute, tmp_path):
    bport = free_port()
    p = sim_factory("--time-scale", "0", "--role", "prefill", "--bootstrap-port", bport)
    d = sim_factory("--time-scale", "0", "--role", "decode")
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""
workers:
  - {url: "%s", role: prefill, bootstrap_port: %d}
  - {url: "%s", role: decode}
routes:
  - name: %s
    pd: {mode: sglang}
    targets: ["%s", "%s"]
""" % (p.url, bport, d.url, SIM_MODEL, p.url, d.url))
    kv = kvroute([], model=None, policy=None, health_interval_ms=0,
                 extra=["--config", str(cfg)])
    for stream in (False, True):
        r = sim_chat(kv, "sglang %s" % stream, stream=stream,
                     stream_options={"include_usage": True} if stream else None)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-worker"] == d.url
        assert r.headers["x-kvroute-prefill-worker"] == p.url
    pl, dl = sim_log(p), sim_log(d)
    assert len(pl) == len(dl) == 2
    for pe, de in zip(pl, dl):
        assert pe["bootstrap_room"] == de["bootstrap_room"] is not None
        assert pe["request_id"] == de["request_id"]
        assert de["kv_transfer"]["result"] == "fetched"
    assert d.metrics().get("kvroute_sim:kv_recomputed_requests_total") == 0


def test_sim_vllm_openai_node_client(sim_factory, kvroute):
    """openai@6 over a disaggregated kvroute-sim fleet: both answers intact, each request one
    prefill call and one decode call that fetched the prefill's blocks."""
    node = shutil.which("node")
    js = E2E_DIR / "js"
    assert node and (js / "node_modules" / "openai").is_dir(), "node or openai@6 missing"
    ps, ds = sim_fleet(sim_factory, 2, 2)
    kv = pd_kvroute(kvroute, ps, ds, model=SIM_MODEL)
    p = subprocess.run([node, str(js / "openai_client.mjs"), kv.url + "/v1", SIM_MODEL],
                       cwd=str(js), capture_output=True, timeout=60, text=True)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    steps = {o["step"]: o for o in lines}
    assert p.returncode == 0, "openai client failed: %r; %s" % (lines[-1:], p.stderr[-2000:])
    assert steps["chat"]["content"] and steps["chat"]["usage"]["completion_tokens"] == 8
    assert steps["chat"]["worker"] in (ds[0].url, ds[1].url)
    assert steps["stream"]["content"] and steps["stream"]["usage"]["completion_tokens"] > 0
    assert steps["stream"]["finish_reason"] in ("stop", "length")
    pre = [e for w in ps for e in sim_log(w)]
    dec = [e for w in ds for e in sim_log(w)]
    assert len(pre) == 2 and len(dec) == 2
    assert all(e["max_tokens"] == 1 and e["stream"] is False for e in pre)
    assert sorted(e["request_id"] for e in pre) == sorted(e["request_id"] for e in dec)
    assert all(e["kv_transfer"]["result"] == "fetched" for e in dec)


def test_sim_discovered_route_is_disaggregated(sim_factory, kvroute):
    """Without --model the route comes from the workers' /v1/models: prefill and decode sims
    listing the same model make one disaggregated route."""
    ps, ds = sim_fleet(sim_factory, 1, 1)
    kv = pd_kvroute(kvroute, ps, ds, model=None)
    r = sim_chat(kv, "discovered")
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-prefill-worker"] == ps[0].url
    assert r.headers["x-kvroute-worker"] == ds[0].url
