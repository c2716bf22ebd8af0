"""Security and admission: client API keys (--api-key-file / auth.api_keys_file), workers' own
upstream keys (api_key_file / api_key_env), the egress policy (load-time --check and
connect-time refusal), admission control (--max-inflight, worker max_inflight, the bounded
fair queue: --max-queue, --queue-timeout-ms), per-key rate limits and --max-connections-per-ip.

Real processes on 127.0.0.1 only: stub workers (tests/e2e/stub_worker.py), whose /stub/log shows
exactly which requests and headers reached a worker, and slow answers on demand (x-stub-mode
"json,delay:MS"). Every wait is bounded; the machine may be slow, so the tests assert behaviour
(who got what, in which order, what never arrived) and keep timing bounds generous except where
the timing is the behaviour.
"""
import asyncio
import concurrent.futures
import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from conftest import (E2E_DIR, KVROUTE_BIN, MODEL, SSL_CTX, Metrics, Proc, RawConn,
                      assert_openai_error, chat_body, completion_body, free_port, header_value,
                      header_values, http_post, responses_body, wait_until)

JS = E2E_DIR / "js"

# client keys (never forwarded, never shown)
ALICE = "sk-alice-7Qw9Zr2LmN4p"
BOB = "sk-bob-Hk3Vt8Yd1XsE"
NAMELESS = "sk-nameless-Pp0Oo9Ii8Uu7"
NODE_KEY = "sk-kvroute-e2e"  # the key tests/e2e/js/openai_client.mjs sends
WRONG = "sk-wrong-Jj6Hh5Gg4Ff3"
# workers' own keys
UP_A = "up-worker-a-Rt5Ew3Qa1Zx"
UP_B = "up-worker-b-Mn8Bv6Cx4Zl"
UP_ENV = "KVR_E2E_WORKER_B_KEY"

# ============================================================================ helpers
class Admin:
    """The admin listener of one kvroute (no admin token in these tests)."""

    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def get(self, path):
        return httpx.get(self.base + path, timeout=5.0, verify=SSL_CTX)

    def post(self, path, body=None, headers=None):
        h = {"content-type": "application/json"}
        h.update(headers or {})
        return httpx.post(self.base + path, content=json.dumps(body if body is not None else {}),
                          headers=h, timeout=5.0, verify=SSL_CTX)

    def workers(self):
        r = self.get("/workers")
        assert r.status_code == 200, r.text
        return r.json()["workers"]

    def reload(self):
        return self.post("/reload")


def write_file(path, text):
    """Writes atomically (a reload never reads half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def start_config(kvroute, cfg_path, extra=(), admin=True, **kw):
    """kvroute --config FILE (+ --admin-port); no --worker/--model/--policy on the command line."""
    args = ["--config", str(cfg_path)]
    adm = None
    if admin:
        p = free_port()
        args += ["--admin-port", p]
        adm = Admin(p)
    kv = kvroute([], model=None, policy=None, extra=args + list(extra), **kw)
    return kv, adm


def run_quick(procs, tmp_path, argv, timeout=10.0):
    """Runs a command that exits by itself (--check) through the registry; returns (exit status,
    stdout, stderr)."""
    if not KVROUTE_BIN.exists():
        pytest.skip("kvroute binary not built: %s" % KVROUTE_BIN)
    p = Proc([str(a) for a in argv], tmp_path / ("quick-%d.stderr" % len(procs.procs)),
             stdout=subprocess.PIPE)
    procs.procs.append(p)
    try:
        out, _ = p.popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("%s did not exit within %.0fs" % (" ".join(map(str, argv)), timeout))
    return p.popen.returncode, out.decode("utf-8", "replace"), p.stderr_text()


def bearer(key):
    return {"authorization": "Bearer " + key}


def xkey(key):
    return {"x-api-key": key}


def chat(kv, key=None, headers=None, content="hello", timeout=10.0, **extra):
    h = dict(bearer(key)) if key else {}
    h.update(headers or {})
    return kv.post("/v1/chat/completions", chat_body(content=content, **extra), headers=h,
                   timeout=timeout)


def in_progress(w):
    return [e for e in w.proxied() if e["ended"] == "in_progress"]


def max_overlap(entries):
    """Most requests a worker was serving at once, from its log: [t_start (request fully read),
    t_headers_sent] of JSON answers (head and body go in one write at t_headers_sent, so
    kvroute held its slot for at least this interval)."""
    ev = []
    for e in entries:
        assert e["t_headers_sent"] is not None, e
        ev.append((e["t_start"], 1))
        ev.append((e["t_headers_sent"], -1))
    ev.sort(key=lambda x: (x[0], x[1]))  # an end before a start at the same instant
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def assert_no_secrets(where, text, secrets):
    for s in secrets:
        assert s not in text, "secret %r...%r shows in %s" % (s[:4], s[-2:], where)


def keys_file(path, text):
    return write_file(path, text)


def parse_reset(v):
    """An x-ratelimit-reset-* value ("12s", "1m0s", "0.5s", "12") → seconds."""
    assert v, "empty reset value"
    if re.fullmatch(r"\d+(\.\d+)?", v):
        return float(v)
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", v)
    assert parts and "".join(a + b for a, b in parts) == v, "unreadable reset value %r" % v
    for n, u in parts:
        total += float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u]
    return total


# ============================================================================ client API keys
def test_client_keys_gate_the_api_and_never_reach_workers(procs, stub, kvroute, tmp_path,
                                                          monkeypatch):
    wa, wb = stub(name="wa"), stub(name="wb")
    keys = keys_file(tmp_path / "client-keys", (
        "# kvroute's clients\n"
        "alice:%s\n"
        "\n"
        "bob:%s   \n"
        "%s\n" % (ALICE, BOB, NAMELESS)))
    up_a = tmp_path / "worker-a-key"
    up_a.write_text(UP_A + "\nnot-the-key-second-line\n")
    monkeypatch.setenv(UP_ENV, UP_B)  # kvroute inherits the test's environment
    # no model: routes come from the workers' /v1/models (discovery carries the worker key too);
    # health checks on a path the stub logs with its headers (its /health is not logged)
    cfg = write_file(tmp_path / "kvroute.yaml", """\
auth: {api_keys_file: "%s"}
health_interval_ms: 200
health_path: "/v1/models?probe=health"
scrape_interval: 1
discovery_interval: 1
defaults: {policy: round_robin}
workers:
  - {url: "%s", name: wa, api_key_file: "%s"}
  - {url: "%s", name: wb, api_key_env: %s}
""" % (keys, wa.url, up_a, wb.url, UP_ENV))
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", cfg])
    assert rc == 0, (rc, out, err)
    assert_no_secrets("kvroute --check output", out + err, [ALICE, BOB, NAMELESS, UP_A, UP_B])
    kv, adm = start_config(kvroute, cfg, extra=["--log-level", "debug"])
    monkeypatch.delenv(UP_ENV)

    def models(key):
        r = kv.get("/v1/models", headers=bearer(key), timeout=5.0)
        return r.status_code == 200 and MODEL in {m["id"] for m in r.json()["data"]}
    wait_until(lambda: models(ALICE), 8, interval=0.1, what="the route discovered from /v1/models")

    n_missing = n_invalid = 0
    bodies = []
    # ---- no key: 401 invalid_api_key on every /v1/* path, nothing reaches a worker
    no_key = [kv.post("/v1/chat/completions", chat_body()),
              kv.post("/v1/completions", completion_body()),
              kv.post("/v1/responses", responses_body()),
              kv.post("/v1/chat/completions", chat_body(stream=True)),
              kv.get("/v1/models"),
              kv.post("/v1/no-such-endpoint", {"x": 1}),
              kv.post("/v1/chat/completions", chat_body(), headers={"authorization": ""})]
    for r in no_key:
        err = assert_openai_error(r, 401)
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key", err
        assert r.headers.get("content-type", "").startswith("application/json"), r.headers
        bodies.append(r.text + repr(r.headers))
    n_missing += len(no_key)
    # ---- a wrong key (also: a prefix of a key, a key plus a byte, a key's name, a worker's own
    # key, a key in the wrong case) → 401 invalid_api_key
    wrong = [bearer(WRONG), xkey(WRONG), bearer(ALICE[:-1]), bearer(ALICE + "x"),
             bearer("alice"), xkey("bob"), bearer(UP_A), xkey(UP_B), bearer(ALICE.upper())]
    for h in wrong:
        for r in (kv.post("/v1/chat/completions", chat_body(), headers=h),
                  kv.get("/v1/models", headers=h)):
            err = assert_openai_error(r, 401)
            assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key", \
                (h, err)
            bodies.append(r.text + repr(r.headers))
            n_invalid += 1
    assert sum(len(w.proxied()) for w in (wa, wb)) == 0, "a refused request reached a worker"

    # ---- the right keys: Bearer or x-api-key, all three endpoints, streaming too
    ok = []
    for i in range(4):
        ok.append(("alice", kv.post("/v1/chat/completions", chat_body(content="a%d" % i),
                                    headers=bearer(ALICE))))
        ok.append(("alice", kv.post("/v1/chat/completions", chat_body(content="ax%d" % i),
                                    headers=xkey(ALICE))))
    ok.append(("bob", kv.post("/v1/completions", completion_body(), headers=xkey(BOB))))
    ok.append(("bob", kv.post("/v1/responses", responses_body(), headers=bearer(BOB))))
    ok.append(("bob", kv.post("/v1/chat/completions", chat_body(stream=True),
                              headers=bearer(BOB))))
    ok.append(("nameless", kv.post("/v1/chat/completions", chat_body(), headers=bearer(NAMELESS))))
    for who, r in ok:
        assert r.status_code == 200, (who, r.status_code, r.text[:300])
    assert "data: [DONE]" in ok[-2][1].text, ok[-2][1].text[:300]
    served = {r.headers.get("x-kvroute-worker") for _, r in ok}
    assert served == {wa.url, wb.url}, "round robin must use both workers: %r" % served

    # ---- open paths: /healthz, /readyz, /metrics need no key
    for p in ("/healthz", "/readyz", "/metrics"):
        r = kv.get(p)
        assert r.status_code == 200, (p, r.status_code, r.text[:200])

    # ---- what the workers saw: their own key on every request kvroute made to them (proxied,
    # health checks, metric scrapes, /v1/models discovery), never a client credential
    def kinds(w):
        got = {"proxied": 0, "health": 0, "scrape": 0, "discovery": 0}
        for e in w.requests(prefix="/"):
            if e["path"] in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
                got["proxied"] += 1
            elif e["target"] == "/v1/models?probe=health":
                got["health"] += 1
            elif e["path"] == "/metrics":
                got["scrape"] += 1
            elif e["target"] == "/v1/models":
                got["discovery"] += 1
        return got
    wait_until(lambda: all(min(kinds(w).values()) >= 1 for w in (wa, wb)), 6, interval=0.1,
               what="health checks, scrapes and discovery requests at both workers")
    client_secrets = [ALICE, BOB, NAMELESS, WRONG, "alice", ALICE[:-1]]
    for w, up in ((wa, UP_A), (wb, UP_B)):
        entries = w.requests(prefix="/")
        assert entries
        for e in entries:
            what = "%s %s at %s" % (e["method"], e["target"], w.name)
            assert header_values(e, "authorization") == ["Bearer " + up], \
                "%s: authorization %r, want the worker's own key" % (
                    what, [v[:12] + "..." for v in header_values(e, "authorization")])
            assert header_values(e, "x-api-key") == [], "%s: x-api-key forwarded" % what
            assert_no_secrets(what, json.dumps(e["headers"]), client_secrets + [
                UP_B if up == UP_A else UP_A, "not-the-key-second-line"])
    assert len(wa.proxied()) + len(wb.proxied()) == len(ok)

    # ---- metrics: failures by reason, requests by key name
    m = kv.metrics()
    assert m.types.get("kvroute_auth_failures_total") == "counter"
    assert m.get("kvroute_auth_failures_total", reason="missing") == n_missing, m.find(
        "kvroute_auth_failures_total")
    assert m.get("kvroute_auth_failures_total", reason="invalid") == n_invalid, m.find(
        "kvroute_auth_failures_total")
    assert m.get("kvroute_requests_total", key="alice", endpoint="/v1/chat/completions",
                 code="200") == 8
    assert m.get("kvroute_requests_total", key="bob", code="200",
                 endpoint=lambda e: e in ("/v1/completions", "/v1/responses",
                                          "/v1/chat/completions")) == 3
    key_labels = {lb["key"] for lb, _ in m.find("kvroute_requests_total")}
    assert {"alice", "bob"} <= key_labels, key_labels
    named = key_labels - {"alice", "bob", "-"}
    assert len(named) == 1, "the nameless key needs one name of its own: %r" % key_labels
    assert m.get("kvroute_requests_total", key=named.pop(), code="200") == 1

    # ---- keys appear nowhere: stderr (debug log), /workers, /routes, /debug/route, /metrics,
    # error bodies
    secrets = [ALICE, BOB, NAMELESS, WRONG, UP_A, UP_B, ALICE[:-1]]
    dbg = adm.post("/debug/route", chat_body(content="explain"), headers=bearer(ALICE))
    assert dbg.status_code == 200, dbg.text
    dbg2 = adm.post("/debug/route", chat_body(content="explain"), headers=xkey(BOB))
    for where, text in (("/workers", adm.get("/workers").text),
                        ("/routes", adm.get("/routes").text),
                        ("/debug/route", dbg.text + repr(dbg.headers)),
                        ("/debug/route (x-api-key)", dbg2.text),
                        ("/metrics", m.text),
                        ("401 answers", "\n".join(bodies)),
                        ("200 answers' headers", "\n".join(repr(r.headers) for _, r in ok)),
                        ("kvroute stderr", kv.proc.stderr_text())):
        assert_no_secrets(where, text, secrets)
    assert "debug" in kv.argv  # the most talkative log level was the one checked


def test_metrics_require_key_and_key_label_without_auth(stub, kvroute, tmp_path):
    w = stub()
    keys = keys_file(tmp_path / "keys", "ops:%s\n" % ALICE)
    # the registry's teardown reads /metrics without a key: this test checks in-flight itself
    kv = kvroute([w], health_interval_ms=0, check_inflight=False,
                 extra=["--api-key-file", keys, "--metrics-require-key"])
    for p in ("/healthz", "/readyz"):
        assert kv.get(p).status_code == 200, p
    for h in ({}, bearer(WRONG), xkey(BOB)):
        r = kv.get("/metrics", headers=h)
        err = assert_openai_error(r, 401)
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key", err
        assert "kvroute_" not in r.text
    for h in (bearer(ALICE), xkey(ALICE)):
        r = kv.get("/metrics", headers=h)
        assert r.status_code == 200, r.text[:200]
        m = Metrics(r.text)
        assert m.has("kvroute_auth_failures_total"), m.family_names()
    assert m.get("kvroute_auth_failures_total", reason="missing") == 1
    assert m.get("kvroute_auth_failures_total", reason="invalid") == 2
    assert chat(kv, ALICE).status_code == 200
    # the data plane still needs the key
    assert_openai_error(chat(kv), 401)
    m = Metrics(kv.get("/metrics", headers=bearer(ALICE)).text)
    assert m.find("kvroute_worker_inflight") and m.get("kvroute_worker_inflight") == 0

    # without auth: /metrics open, the key label is "-", client credentials still not forwarded
    w2 = stub()
    kv2 = kvroute([w2], health_interval_ms=0)
    r = chat(kv2, headers={"authorization": "Bearer " + ALICE, "x-api-key": BOB})
    assert r.status_code == 200, r.text
    m2 = kv2.metrics()
    assert m2.get("kvroute_requests_total", key="-", code="200",
                  endpoint="/v1/chat/completions") == 1, m2.find("kvroute_requests_total")
    assert all(lb["key"] == "-" for lb, _ in m2.find("kvroute_requests_total"))
    assert m2.get("kvroute_auth_failures_total") == 0
    e = w2.proxied()[0]
    assert header_values(e, "authorization") == [] and header_values(e, "x-api-key") == [], \
        e["headers"]


def test_openai_node_client_with_a_key(stub, kvroute, tmp_path):
    node = shutil.which("node")
    assert node, "node not installed (scripts/install-deps.sh installs nodejs)"
    assert (JS / "node_modules" / "openai").is_dir(), \
        "openai npm package not installed: run scripts/install-deps.sh (npm ci in tests/e2e/js)"
    w = stub()
    up = tmp_path / "up"
    up.write_text(UP_A + "\n")
    keys = keys_file(tmp_path / "keys", "node:%s\n" % NODE_KEY)
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
auth: {api_keys_file: "%s"}
health_interval_ms: 0
workers:
  - {url: "%s", name: w, api_key_file: "%s"}
""" % (MODEL, keys, w.url, up))
    kv, _ = start_config(kvroute, cfg, admin=False)
    try:
        p = subprocess.run([node, str(JS / "openai_client.mjs"), kv.url + "/v1", MODEL],
                           cwd=str(JS), capture_output=True, timeout=60, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("openai client did not finish within 60 s")
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    steps = {o["step"]: o for o in lines}
    assert p.returncode == 0, "openai client failed: %r; stderr: %s" % (
        lines[-1:], p.stderr[-2000:])
    assert MODEL in steps["models"]["ids"], steps["models"]
    assert steps["chat"]["content"] == "tok0 tok1 tok2 tok3 tok4 ", steps["chat"]
    st = steps["stream"]
    assert st["content"] == "tok0 tok1 tok2 tok3 tok4 " and st["finish_reason"] == "stop", st
    assert st["usage"] and st["usage"]["completion_tokens"] == 5, st

    # a wrong key: the client sees an AuthenticationError (401) with OpenAI's error code
    script = r"""
import OpenAI from "openai";
const c = new OpenAI({ baseURL: process.argv[1], apiKey: process.argv[2], maxRetries: 0,
                       timeout: 10000 });
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
for (const stream of [false, true]) {
  try {
    const r = await c.chat.completions.create({ model: process.argv[3], stream,
      messages: [{ role: "user", content: "hi" }] });
    if (stream) for await (const _ of r) {}
    out({ stream, ok: true });
  } catch (e) {
    out({ stream, ok: false, name: e.constructor.name, status: e.status ?? null,
          code: e.code ?? null, type: e.type ?? null });
  }
}
"""
    p = subprocess.run([node, "--input-type=module", "-e", script, kv.url + "/v1", WRONG, MODEL],
                       cwd=str(JS), capture_output=True, timeout=60, text=True)
    res = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    assert len(res) == 2, (p.stdout, p.stderr[-2000:])
    for o in res:
        assert o == {"stream": o["stream"], "ok": False, "name": "AuthenticationError",
                     "status": 401, "code": "invalid_api_key",
                     "type": "invalid_request_error"}, o

    reqs = w.proxied()
    assert len(reqs) == 2 and reqs[1]["stream"] is True, [(e["path"], e["stream"]) for e in reqs]
    for e in w.requests(prefix="/"):
        assert header_values(e, "authorization") == ["Bearer " + UP_A], (e["target"], e["headers"])
        assert header_values(e, "x-api-key") == []
        assert NODE_KEY not in json.dumps(e["headers"]) and WRONG not in json.dumps(e["headers"])


def test_key_file_reload(stub, kvroute, tmp_path):
    w = stub()
    keys = keys_file(tmp_path / "keys", "alice:%s\nbob:%s\n" % (ALICE, BOB))
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
auth: {api_keys_file: "%s"}
health_interval_ms: 0
workers: ["%s"]
""" % (MODEL, keys, w.url))
    kv, adm = start_config(kvroute, cfg)
    assert chat(kv, ALICE).status_code == 200
    assert chat(kv, BOB).status_code == 200
    new_alice = "sk-alice-rotated-Wq2Er4Ty6"
    # POST /reload: alice's key rotated, bob's removed
    keys_file(keys, "alice:%s\n" % new_alice)
    r = adm.reload()
    assert r.status_code == 200, r.text
    for k in (ALICE, BOB):
        err = assert_openai_error(chat(kv, k), 401)
        assert err["code"] == "invalid_api_key", err
        assert_openai_error(kv.post("/v1/chat/completions", chat_body(), headers=xkey(k)), 401)
    assert chat(kv, new_alice).status_code == 200
    assert kv.post("/v1/chat/completions", chat_body(), headers=xkey(new_alice)).status_code == 200
    # SIGHUP: bob is back
    keys_file(keys, "alice:%s\nbob:%s\n" % (new_alice, BOB))
    ok0 = kv.metrics().get("kvroute_config_reloads_total", result="ok")
    kv.proc.signal(signal.SIGHUP)
    wait_until(lambda: kv.metrics().get("kvroute_config_reloads_total", result="ok") == ok0 + 1,
               5, interval=0.05, what="the SIGHUP reload to be applied")
    assert chat(kv, BOB).status_code == 200
    assert chat(kv, new_alice).status_code == 200
    assert_openai_error(chat(kv, ALICE), 401)
    m = kv.metrics()
    assert m.get("kvroute_requests_total", key="alice", code="200") == 4
    assert m.get("kvroute_requests_total", key="bob", code="200") == 2
    assert len(w.proxied()) == 6
    assert_no_secrets("kvroute stderr", kv.proc.stderr_text(), [ALICE, BOB, new_alice])


# ============================================================================ egress
def test_check_refuses_a_worker_in_a_denied_cidr(procs, stub, kvroute, tmp_path):
    w = stub()
    good = """\
model: %s
health_interval_ms: 0
egress:
  deny: [10.0.0.0/8, 169.254.169.254/32]
workers:
  - {url: "%s", name: ok-worker}
""" % (MODEL, w.url)
    cfg = write_file(tmp_path / "good.yaml", good)
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", cfg])
    assert rc == 0, (rc, out, err)
    bad = write_file(tmp_path / "bad.yaml",
                     good + "  - {url: \"http://10.20.30.40:8000\", name: gpu-internal}\n")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", bad])
    assert rc == 1, (rc, out, err)
    lines = [ln for ln in (out + "\n" + err).splitlines()
             if "gpu-internal" in ln and "10.0.0.0/8" in ln]
    assert lines, "no line names the worker and the rule:\nstdout:\n%s\nstderr:\n%s" % (out, err)
    assert not any("ok-worker" in ln and "refused" in ln for ln in (out + err).splitlines())
    meta = write_file(tmp_path / "meta.yaml",
                      good + "  - {url: \"http://169.254.169.254/\", name: metadata}\n")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", meta])
    assert rc == 1, (rc, out, err)
    assert any("metadata" in ln and "169.254.169.254/32" in ln
               for ln in (out + "\n" + err).splitlines()), (out, err)

    # a reload that adds such a worker is refused; the running config stays
    live = write_file(tmp_path / "live.yaml", good)
    kv, adm = start_config(kvroute, live)
    assert chat(kv).status_code == 200
    write_file(live, good + "  - {url: \"http://10.20.30.40:8000\", name: gpu-internal}\n")
    r = adm.reload()
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert body.get("result") == "error", body
    assert any("gpu-internal" in e and "10.0.0.0/8" in e for e in body["errors"]), body
    assert {x["url"] for x in adm.workers()} == {w.url}
    assert kv.metrics().get("kvroute_config_reloads_total", result="error") == 1
    for _ in range(3):
        r = chat(kv)
        assert r.status_code == 200 and r.headers.get("x-kvroute-worker") == w.url, r.text


def test_egress_refused_at_connect_time(procs, stub, kvroute, tmp_path):
    w = stub()
    url = "http://localhost:%d" % w.port  # a name: the load-time check cannot judge it
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
health_interval_ms: 0
egress:
  deny: [127.0.0.0/8, "::1/128"]
workers:
  - {url: "%s", name: loopback-by-name}
""" % (MODEL, url))
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", cfg])
    assert rc == 0, "--check must pass a worker named by host name: %r" % ((rc, out, err),)
    kv, _ = start_config(kvroute, cfg, admin=False)
    for body in (chat_body(content="one"), chat_body(content="two", stream=True)):
        r = kv.post("/v1/chat/completions", body)
        assert r.status_code in (502, 503), (r.status_code, r.text[:300])
        assert_openai_error(r)
    m = kv.metrics()
    denied = m.find("kvroute_egress_denied_total")
    assert m.get("kvroute_egress_denied_total", endpoint=url) >= 2, denied
    assert all(lb["endpoint"] == url for lb, _ in denied), denied
    log = w.log()
    # the one connection the stub accepted is this very GET /stub/log
    assert log["requests"] == [] and log["connections_accepted"] == 1, \
        "a denied connection reached the worker: %r" % log
    assert re.search(r"egress denied.*%s" % re.escape(url), kv.proc.stderr_text()), \
        kv.proc.stderr_text(20)


# ============================================================================ admission
def _poll_while(stop, fn, period=0.02):
    """Calls fn() every `period` s on a thread until stop is set; returns the thread."""
    def run():
        while not stop.is_set():
            try:
                fn()
            except Exception:  # noqa: BLE001 - a poll may race a teardown
                pass
            time.sleep(period)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_worker_max_inflight_queues_the_rest(stub, kvroute, tmp_path):
    w1, w2 = stub(name="w1"), stub(name="w2")
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
health_interval_ms: 0
defaults: {policy: round_robin}
workers:
  - {url: "%s", name: w1, max_inflight: 4}
  - {url: "%s", name: w2, max_inflight: 4}
""" % (MODEL, w1.url, w2.url))
    kv, adm = start_config(kvroute, cfg)
    seen = {"inflight": {}, "depth": 0.0, "admin": {}}

    def poll():
        m = kv.metrics()
        for lb, v in m.find("kvroute_worker_inflight"):
            seen["inflight"][lb["worker"]] = max(seen["inflight"].get(lb["worker"], 0), v)
        seen["depth"] = max(seen["depth"], m.get("kvroute_queue_depth", model=MODEL))
        for x in adm.workers():
            if "inflight" in x:
                seen["admin"][x["url"]] = max(seen["admin"].get(x["url"], 0), x["inflight"])
    stop = threading.Event()
    poller = _poll_while(stop, poll)
    n = 40
    try:
        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            futs = [ex.submit(chat, kv, None, {"x-stub-mode": "json,delay:1000"},
                              "slow %d" % i, 40.0) for i in range(n)]
            res = [f.result(timeout=60) for f in futs]
    finally:
        stop.set()
        poller.join(5)
    bad = [(r.status_code, r.text[:200]) for r in res if r.status_code != 200]
    assert not bad, "not every request succeeded: %r" % bad[:5]
    # the workers' own view: never more than 4 at once each, and the limit was used
    for w in (w1, w2):
        entries = w.proxied()
        assert max_overlap(entries) == 4, (w.name, max_overlap(entries))
    assert len(w1.proxied()) + len(w2.proxied()) == n
    # kvroute's view agrees
    assert seen["inflight"] and all(v <= 4 for v in seen["inflight"].values()), seen
    assert set(seen["admin"]) == {w1.url, w2.url}, seen
    assert all(v <= 4 for v in seen["admin"].values()), seen
    assert seen["depth"] > 0, "kvroute_queue_depth never moved: %r" % seen
    m = kv.metrics()
    assert m.types.get("kvroute_queue_wait_seconds") == "histogram"
    assert m.get("kvroute_queue_wait_seconds_count", model=MODEL) > 0
    assert m.get("kvroute_queue_wait_seconds_sum", model=MODEL) > 0
    assert m.get("kvroute_queue_depth", model=MODEL) == 0
    assert m.get("kvroute_rejected_total") == 0


def test_full_queue_answers_503_at_once(stub, kvroute, tmp_path):
    w1, w2 = stub(name="w1"), stub(name="w2")
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
health_interval_ms: 0
defaults: {policy: round_robin}
workers:
  - {url: "%s", name: w1, max_inflight: 4}
  - {url: "%s", name: w2, max_inflight: 4}
""" % (MODEL, w1.url, w2.url))
    kv, _ = start_config(kvroute, cfg, extra=["--max-queue", "5", "--retry-after", "2"])
    slow = {"x-stub-mode": "json,delay:4000"}
    ex = concurrent.futures.ThreadPoolExecutor(20)
    try:
        running = [ex.submit(chat, kv, None, slow, "run %d" % i, 30.0) for i in range(8)]
        wait_until(lambda: len(in_progress(w1)) + len(in_progress(w2)) == 8, 8,
                   what="8 requests in flight at the workers (4 each)")
        queued = [ex.submit(chat, kv, None, slow, "queued %d" % i, 30.0) for i in range(5)]
        wait_until(lambda: kv.metrics().get("kvroute_queue_depth", model=MODEL) == 5, 5,
                   what="kvroute_queue_depth == 5")
        over = []
        for i in range(4):
            t0 = time.monotonic()
            r = chat(kv, None, slow, "overflow %d" % i, 10.0)
            over.append((r, time.monotonic() - t0))
        # all answered while the 8 were still running (their answers take 4 s)
        assert not any(f.done() for f in running + queued), "a slow request ended already"
        for r, dt in over:
            err = assert_openai_error(r, 503)
            assert err["type"] == "server_error" and err["code"] == "overloaded", err
            assert r.headers.get("retry-after") == "2", r.headers
            assert dt < 1.5, "a full queue must answer at once, took %.2fs" % dt
        m = kv.metrics()
        assert m.get("kvroute_rejected_total", model=MODEL, reason="queue_full") == 4
        assert m.get("kvroute_queue_depth", model=MODEL) == 5
        res = [f.result(timeout=30) for f in running + queued]
    finally:
        ex.shutdown(wait=True)
    assert all(r.status_code == 200 for r in res), [(r.status_code, r.text[:100]) for r in res]
    assert len(w1.proxied()) + len(w2.proxied()) == 13, "an overflow request reached a worker"


def test_queue_is_fair_across_keys(stub, kvroute, tmp_path):
    w = stub()
    keys = keys_file(tmp_path / "keys", "alice:%s\nbob:%s\n" % (ALICE, BOB))
    kv = kvroute([w], health_interval_ms=0,
                 extra=["--api-key-file", keys, "--max-inflight", "4"])
    n_a, n_b = 200, 5
    done = []  # completion order: ("A"|"B", i, status)
    mark = {}

    async def one(client, who, key, i):
        r = await client.post(kv.url + "/v1/chat/completions",
                              content=json.dumps(chat_body(content="%s %d" % (who, i))),
                              headers={"content-type": "application/json",
                                       "authorization": "Bearer " + key,
                                       "x-test-tag": "%s-%d" % (who, i),
                                       "x-stub-mode": "json,delay:300"})
        done.append((who, i, r.status_code))

    async def main():
        limits = httpx.Limits(max_connections=n_a + n_b + 10,
                              max_keepalive_connections=n_a + n_b + 10)
        async with httpx.AsyncClient(limits=limits, timeout=90.0, verify=SSL_CTX) as client:
            ta = [asyncio.ensure_future(one(client, "A", ALICE, i)) for i in range(n_a)]

            def depth():
                return kv.metrics().get("kvroute_queue_depth", model=MODEL)
            deadline = time.monotonic() + 15
            while await asyncio.to_thread(depth) < n_a - 8 - sum(1 for d in done if d[0] == "A"):
                assert time.monotonic() < deadline, "A's burst never queued: depth %r" % depth()
                await asyncio.sleep(0.02)
            mark["a_done_before_b"] = sum(1 for d in done if d[0] == "A")
            tb = []
            for i in range(n_b):  # 30 ms apart: B's own order is known (FIFO within a key)
                tb.append(asyncio.ensure_future(one(client, "B", BOB, i)))
                await asyncio.sleep(0.03)
            await asyncio.wait_for(asyncio.gather(*tb), 60)
            mark["a_done_at_b_end"] = sum(1 for d in done if d[0] == "A")
            await asyncio.wait_for(asyncio.gather(*ta), 90)
    asyncio.run(main())
    assert len(done) == n_a + n_b and all(d[2] == 200 for d in done), \
        [d for d in done if d[2] != 200][:5]
    a_between = mark["a_done_at_b_end"] - mark["a_done_before_b"]
    assert a_between < 50, ("B's %d requests waited behind %d of A's (A done when B sent: %d): "
                            "the queue is not fair across keys" % (n_b, a_between,
                                                                   mark["a_done_before_b"]))
    # FIFO within a key: B's requests reached the worker in the order sent (slots free in
    # clumps of 4, so two dispatched in one round may arrive a few ms apart either way)
    t_b = {header_value(e, "x-test-tag"): e["t_start"] for e in w.proxied()
           if (header_value(e, "x-test-tag") or "").startswith("B-")}
    assert len(t_b) == n_b, t_b
    starts = [t_b["B-%d" % i] for i in range(n_b)]
    assert all(a <= b + 0.05 for a, b in zip(starts, starts[1:])), \
        "B's requests were not started in the order sent: %r" % [b - starts[0] for b in starts]
    assert len(w.proxied()) == n_a + n_b
    assert max_overlap(w.proxied()) <= 4, max_overlap(w.proxied())
    m = kv.metrics()
    assert m.get("kvroute_requests_total", key="alice", code="200") == n_a
    assert m.get("kvroute_requests_total", key="bob", code="200") == n_b


def test_rate_limit_per_key(stub, kvroute, tmp_path):
    w = stub()
    keys = keys_file(tmp_path / "keys", "limited:%s\nfree:%s\n" % (ALICE, BOB))
    cfg = write_file(tmp_path / "kvroute.yaml", """\
model: %s
auth: {api_keys_file: "%s"}
health_interval_ms: 0
rate_limits:
  limited: {requests_per_minute: 10, tokens_per_minute: 100000}
workers: ["%s"]
""" % (MODEL, keys, w.url))
    kv, _ = start_config(kvroute, cfg, admin=False)
    names = ["limit-requests", "remaining-requests", "reset-requests",
             "limit-tokens", "remaining-tokens", "reset-tokens"]
    seen = []
    for i in range(10):
        r = chat(kv, ALICE, content="limited %d" % i, max_tokens=16)
        assert r.status_code == 200, (i, r.status_code, r.text[:200])
        hv = {n: r.headers.get("x-ratelimit-" + n) for n in names}
        assert all(hv.values()), "response %d lacks x-ratelimit-* headers: %r" % (i, hv)
        seen.append(hv)
    assert all(h["limit-requests"] == "10" for h in seen), seen
    assert [int(h["remaining-requests"]) for h in seen] == list(range(9, -1, -1)), \
        [h["remaining-requests"] for h in seen]
    assert all(h["limit-tokens"] == "100000" for h in seen), seen
    rt = [int(h["remaining-tokens"]) for h in seen]
    assert all(a > b for a, b in zip(rt, rt[1:])) and rt[0] < 100000, rt
    for h in seen:
        assert 0 <= parse_reset(h["reset-requests"]) <= 60, h
        assert 0 <= parse_reset(h["reset-tokens"]) <= 60, h
    # the 11th within the minute: 429, Retry-After, the headers, nothing forwarded
    r = chat(kv, ALICE, content="limited 10", max_tokens=16)
    err = assert_openai_error(r, 429)
    assert err["code"] == "rate_limit_exceeded", err
    ra = r.headers.get("retry-after")
    assert ra and ra.isdigit() and 1 <= int(ra) <= 60, r.headers
    assert r.headers.get("x-ratelimit-limit-requests") == "10", r.headers
    assert r.headers.get("x-ratelimit-remaining-requests") == "0", r.headers
    for n in names:
        assert r.headers.get("x-ratelimit-" + n), (n, r.headers)
    # the same through x-api-key: the identity is the key, not the header
    r = kv.post("/v1/chat/completions", chat_body(), headers=xkey(ALICE))
    assert_openai_error(r, 429)
    assert len(w.proxied()) == 10
    # another key is not limited and gets no x-ratelimit-* headers
    for i in range(12):
        r = chat(kv, BOB, content="free %d" % i)
        assert r.status_code == 200, r.text
        assert not [k for k in r.headers if k.lower().startswith("x-ratelimit-")], r.headers
    m = kv.metrics()
    assert m.get("kvroute_rejected_total", model=MODEL, reason="rate_limited") == 2
    assert m.get("kvroute_requests_total", key="limited", code="429") == 2
    assert m.get("kvroute_requests_total", key="limited", code="200") == 10
    assert len(w.proxied()) == 22


def test_queued_client_that_disconnects_leaves_at_once(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--max-inflight", "1"])
    ex = concurrent.futures.ThreadPoolExecutor(2)
    try:
        holder = ex.submit(chat, kv, None, {"x-stub-mode": "json,delay:3000"}, "holder", 20.0)
        wait_until(lambda: len(in_progress(w)) == 1, 5, what="the slot holder at the worker")
        c = RawConn(kv.port)
        c.send(http_post(kv.port, "/v1/chat/completions", chat_body(content="gone"),
                         headers=["x-test-tag: queued-and-gone"]))
        wait_until(lambda: kv.metrics().get("kvroute_queue_depth", model=MODEL) == 1, 3,
                   what="the second request to wait in the queue")
        c.close()
        t_close = time.monotonic()
        polls = []  # (start after close, end after close, depth)
        while True:
            s = time.monotonic()
            d = kv.metrics().get("kvroute_queue_depth", model=MODEL)
            e = time.monotonic()
            polls.append((s - t_close, e - t_close, d))
            if d == 0 or e - t_close > 2.0:
                break
        assert polls[-1][2] == 0, "the gone client stayed queued: %r" % polls
        late = [p for p in polls if p[2] != 0 and p[0] > 0.1]
        assert not late, "still queued more than 100 ms after the client left: %r" % late
        assert not holder.done()
        r = holder.result(timeout=20)
        assert r.status_code == 200, r.text
    finally:
        ex.shutdown(wait=True)
    time.sleep(0.3)  # the freed slot must not go to the gone request
    tags = [header_value(e, "x-test-tag") for e in w.requests(prefix="/")]
    assert "queued-and-gone" not in tags, "the gone client's request reached the worker"
    assert len(w.proxied()) == 1
    assert kv.assert_serving(what="a queued client left").status_code == 200
    assert kv.metrics().get("kvroute_queue_depth", model=MODEL) == 0


def test_queue_timeout_answers_503(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0,
                 extra=["--max-inflight", "1", "--queue-timeout-ms", "300"])
    ex = concurrent.futures.ThreadPoolExecutor(2)
    try:
        holder = ex.submit(chat, kv, None, {"x-stub-mode": "json,delay:4000"}, "holder", 20.0)
        wait_until(lambda: len(in_progress(w)) == 1, 5, what="the slot holder at the worker")
        t0 = time.monotonic()
        r = chat(kv, headers={"x-test-tag": "timed-out"}, timeout=10.0)
        dt = time.monotonic() - t0
        err = assert_openai_error(r, 503)
        assert err["type"] == "server_error" and err["code"] == "overloaded", err
        assert r.headers.get("retry-after"), r.headers
        assert 0.25 <= dt, "answered before the queue timeout (%.3fs)" % dt
        assert not holder.done() and dt < 3.0, \
            "the wait was not cut at --queue-timeout-ms 300 (%.2fs)" % dt
        m = kv.metrics()
        assert m.get("kvroute_rejected_total", model=MODEL, reason="queue_timeout") == 1
        assert m.get("kvroute_queue_wait_seconds_count", model=MODEL) >= 1
        assert m.get("kvroute_queue_depth", model=MODEL) == 0
        assert holder.result(timeout=20).status_code == 200
    finally:
        ex.shutdown(wait=True)
    time.sleep(0.2)
    assert "timed-out" not in [header_value(e, "x-test-tag") for e in w.requests(prefix="/")]
    assert len(w.proxied()) == 1


# ============================================================================ connections per IP
def test_max_connections_per_ip(stub, kvroute):
    w = stub()
    kv = kvroute([w], health_interval_ms=0, extra=["--max-connections-per-ip", "2"])
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    def answered_conn():
        # the fixture's readiness probe closed its connection, but kvroute may not have
        # read that EOF yet and still counts it: retry until the slot is really free
        deadline = time.monotonic() + 5.0
        while True:
            c = RawConn(kv.port)
            try:
                c.send(req)
                r = c.read_response(method="GET", timeout=2.0)
            except (BrokenPipeError, ConnectionResetError):
                r = None
            if r is not None:
                assert r.status == 200, r
                return c
            c.close()
            assert time.monotonic() < deadline, "no connection from 127.0.0.1 was answered"
            time.sleep(0.05)

    c1 = answered_conn()  # both answered: kvroute holds two open connections from 127.0.0.1
    c2 = answered_conn()
    try:
        # a third from the same address: closed without an answer, at once
        with RawConn(kv.port) as c3:
            assert c3.wait_closed(2.0), "a third connection from 127.0.0.1 stayed open"
            assert bytes(c3.buf) == b"", "the refused connection got bytes: %r" % bytes(c3.buf)
            try:
                c3.send(req)
                r3 = c3.read_response(method="GET", timeout=2.0)
            except (BrokenPipeError, ConnectionResetError):
                r3 = None
            assert r3 is None, r3
        # another address is not affected
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.2", 0))
            s.settimeout(5.0)
            s.connect(("127.0.0.1", kv.port))
            s.sendall(req)
            data = s.recv(4096)
            assert data.startswith(b"HTTP/1.1 200"), data[:100]
        finally:
            s.close()
        # the two open ones still work, a proxied request too
        for c in (c1, c2):
            c.send(http_post(kv.port, "/v1/chat/completions", chat_body()))
            r = c.read_response()
            assert r is not None and r.status == 200, r
        # one closed: a new connection gets in (once kvroute has seen the close)
        c1.close()

        def fresh_ok():
            with RawConn(kv.port) as c:
                c.send(req)
                r = c.read_response(method="GET", timeout=2.0)
                return r is not None and r.status == 200
        wait_until(fresh_ok, 3, interval=0.05, what="a new connection once one of the two closed")
    finally:
        c1.close()
        c2.close()
    assert len(w.proxied()) == 2
