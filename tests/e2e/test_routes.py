"""Routes: discovery from the workers' /v1/models, the YAML config file (--config, --check),
upstream model names, aliases, per-route state, reloads (SIGHUP, POST /reload), draining and
the admin listener's /routes, /workers and /workers/{name}/drain.

Real processes on 127.0.0.1 only: kvroute-sim workers (--time-scale 0) where a real engine's
behaviour matters, stub workers where a test must see exactly what a worker received (their
/stub/log) or needs slow responses (x-stub-mode delay, x-stub-interval-ms). Every wait is
bounded; every test takes a few seconds.
"""
import concurrent.futures
import hashlib
import json
import re
import signal
import subprocess
import time
import urllib.parse

import httpx
import pytest

from conftest import (KVROUTE_BIN, REPO, SSL_CTX, Proc, assert_openai_error, free_port,
                      header_value, parse_sse, wait_until)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EXAMPLE = REPO / "docs" / "kvroute.example.yaml"
LOC_RE = r"^%s:(\d+):(\d+): \S"


# ============================================================================ helpers
class Admin:
    """The admin listener of one kvroute."""

    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def get(self, path):
        return httpx.get(self.base + path, timeout=5.0, verify=SSL_CTX)

    def post(self, path, body=None):
        return httpx.post(self.base + path, content=json.dumps(body if body is not None else {}),
                          headers={"content-type": "application/json"}, timeout=5.0,
                          verify=SSL_CTX)

    def routes(self):
        r = self.get("/routes")
        assert r.status_code == 200, r.text
        return r.json()

    def route(self, name):
        rs = {x["name"]: x for x in self.routes()["routes"]}
        assert name in rs, "route %r not in GET /routes: %r" % (name, sorted(rs))
        return rs[name]

    def workers(self):
        r = self.get("/workers")
        assert r.status_code == 200, r.text
        return {w["url"]: w for w in r.json()["workers"]}

    def drain(self, name, on=True):
        return self.post("/workers/%s/%s" % (name, "drain" if on else "undrain"))

    def reload(self):
        return self.post("/reload")


def write_config(path, text):
    """Writes a config file atomically (a reload never reads half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def start_config(kvroute, cfg_path, admin=True, extra=()):
    """kvroute --config FILE (+ --admin-port when `admin`); no --worker, --model or --policy on
    the command line, so the file decides them."""
    args = ["--config", str(cfg_path)]
    adm = None
    if admin:
        p = free_port()
        args += ["--admin-port", p]
        adm = Admin(p)
    kv = kvroute([], model=None, policy=None, extra=args + list(extra))
    return kv, adm


def model_ids(kv):
    r = kv.get("/v1/models", timeout=5.0)
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"]}


def chat(kv, model, content="hello", headers=None, timeout=10.0, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    body.update(extra)
    return kv.post("/v1/chat/completions", body, headers=headers, timeout=timeout)


def served_by(r):
    return r.headers.get("x-kvroute-worker")


def metric(kv, name, **labels):
    return kv.metrics().get(name, **labels)


def run_quick(procs, tmp_path, argv, timeout=10.0):
    """Runs a command that exits by itself (--check, --help) through the registry; returns
    (exit status, stdout text)."""
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


def slow_posts(kv, model, n, delay_ms, tag):
    """Starts `n` non-streaming requests a stub answers after `delay_ms`; returns the pool and
    the futures (each → httpx.Response)."""
    ex = concurrent.futures.ThreadPoolExecutor(n)

    def one(i):
        return chat(kv, model, "%s %d" % (tag, i), timeout=15.0,
                    headers={"x-stub-mode": "json,delay:%d" % delay_ms})
    return ex, [ex.submit(one, i) for i in range(n)]


def in_progress(stub_worker):
    return [e for e in stub_worker.proxied() if e["ended"] == "in_progress"]


def stub_workers_yaml(ws):
    return "".join('  - {url: "%s", name: %s}\n' % (w.url, n) for n, w in ws)


# ============================================================================ discovery
def test_discovery_routes_each_model_to_the_workers_listing_it(sim_factory, kvroute):
    a1 = sim_factory("--time-scale", "0", model="a")
    a2 = sim_factory("--time-scale", "0", model="a")
    b = sim_factory("--time-scale", "0", model="b")
    adm_port = free_port()
    kv = kvroute([a1, b, a2], model=None, policy="round_robin", health_interval_ms=0,
                 extra=["--discovery-interval", "1", "--admin-port", adm_port])
    wait_until(lambda: {"a", "b"} <= model_ids(kv), 5, interval=0.1,
               what="/v1/models to list the discovered models a and b")
    assert model_ids(kv) == {"a", "b"}, model_ids(kv)
    seen = {"a": [], "b": []}
    for i in range(20):
        for m in ("a", "b"):
            r = chat(kv, m, "discovery %s %d" % (m, i), max_tokens=4)
            assert r.status_code == 200, (m, r.status_code, r.text[:300])
            assert r.json()["model"] == m
            seen[m].append(served_by(r))
    assert set(seen["a"]) == {a1.url, a2.url}, "route a must span exactly a1, a2: %r" % set(seen["a"])
    assert set(seen["b"]) == {b.url}, "route b must be served by b only: %r" % set(seen["b"])
    # the sims agree: each answered exactly the requests kvroute says it sent there
    for s in (a1, a2, b):
        n = sum(1 for m in seen for u in seen[m] if u == s.url)
        assert s.metrics().get("vllm:request_success_total") == n, (s.url, n)
    # /routes: one route per model, over exactly the workers listing it
    rs = {x["name"]: x for x in Admin(adm_port).routes()["routes"]}
    assert set(rs) == {"a", "b"}, rs
    assert {t["url"] for t in rs["a"]["targets"]} == {a1.url, a2.url}, rs["a"]
    assert {t["url"] for t in rs["b"]["targets"]} == {b.url}, rs["b"]
    assert all(t["model"] == "a" for t in rs["a"]["targets"]), rs["a"]
    # an unknown model: 404 model_not_found
    r = chat(kv, "c")
    err = assert_openai_error(r, 404)
    assert err["code"] == "model_not_found", err


def test_discovery_follows_model_changes(sim_factory, stub, kvroute):
    s = sim_factory("--time-scale", "0", model="a")
    w = stub(model="x")
    kv = kvroute([s, w], model=None, policy="round_robin", health_interval_ms=0,
                 extra=["--discovery-interval", "1"])
    wait_until(lambda: model_ids(kv) == {"a", "x"}, 5, interval=0.1, what="models a and x")
    r = chat(kv, "x")
    assert r.status_code == 200 and served_by(r) == w.url, (r.status_code, r.headers)
    w.config(model="y")  # the worker now serves y: x goes, y comes, within ~1 s
    wait_until(lambda: model_ids(kv) == {"a", "y"}, 4, interval=0.1,
               what="the route x to be replaced by y after the worker's /v1/models changed")
    r = chat(kv, "y")
    assert r.status_code == 200 and served_by(r) == w.url, (r.status_code, r.headers)
    err = assert_openai_error(chat(kv, "x"), 404)
    assert err["code"] == "model_not_found", err
    assert chat(kv, "a").status_code == 200


def test_discovery_asks_again_a_worker_that_never_answered(sim_factory, kvroute):
    a = sim_factory("--time-scale", "0", model="a")
    late_port = free_port()
    late_url = "http://127.0.0.1:%d" % late_port
    kv = kvroute([a, late_url], model=None, policy="round_robin", health_interval_ms=0,
                 extra=["--discovery-interval", "30"])  # the late worker must not wait 30 s
    wait_until(lambda: "a" in model_ids(kv), 5, interval=0.1, what="model a")
    assert model_ids(kv) == {"a"}
    late = sim_factory("--time-scale", "0", "--port", late_port, model="late")
    assert late.url == late_url
    wait_until(lambda: "late" in model_ids(kv), 4, interval=0.1,
               what="a worker that never answered to be asked again (every second)")
    for i in range(5):
        r = chat(kv, "late", "late %d" % i, max_tokens=4)
        assert r.status_code == 200 and served_by(r) == late_url, (r.status_code, r.text[:200])


def test_model_flag_is_one_route_over_every_worker(stub, kvroute):
    w1, w2 = stub(model="x"), stub(model="y")
    kv = kvroute([w1, w2], model="z", policy="round_robin", health_interval_ms=0,
                 extra=["--discovery-interval", "1"])
    assert model_ids(kv) == {"z"}
    got = {served_by(chat(kv, "z", "m %d" % i)) for i in range(6)}
    assert got == {w1.url, w2.url}, got
    time.sleep(1.3)  # discovery does not add the workers' own models
    assert model_ids(kv) == {"z"}
    assert_openai_error(chat(kv, "x"), 404)
    assert {e["model"] for w in (w1, w2) for e in w.proxied()} == {"z"}


# ============================================================================ config: routes, aliases, upstream names
def test_config_route_alias_and_upstream_name(sim_factory, stub, kvroute, tmp_path):
    s = sim_factory("--time-scale", "0", model=LLAMA)
    w = stub(model=LLAMA)
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
workers:
  - {url: "%s", name: sim1, weight: 1}
  - "%s"
routes:
  - name: llama
    aliases: [l3]
    policy: round_robin
    targets:
      - {worker: sim1, model: "%s", weight: 1}
      - {worker: "%s", model: "%s"}
""" % (s.url, w.url, LLAMA, w.url, LLAMA))
    kv, adm = start_config(kvroute, cfg)
    assert {"llama", "l3"} <= model_ids(kv), model_ids(kv)
    seen = set()
    for i in range(4):
        for name in ("llama", "l3"):
            r = chat(kv, name, "alias %s %d" % (name, i), max_tokens=4)
            assert r.status_code == 200, (name, r.status_code, r.text[:300])
            seen.add(served_by(r))
    assert seen == {s.url, w.url}, seen  # the sim answered too: it got its own model name
    logged = w.proxied()
    assert len(logged) == 4 and all(e["model"] == LLAMA for e in logged), \
        [e["model"] for e in logged]

    # byte for byte: only the top-level model's value changes; Content-Length follows
    def raw_body(name):
        return ('{"metadata": {"model": "%s", "k": "v"},\n  "messages": [{"role": "user", '
                '"content": "caf\\u00e9 \\"q\\" \\/ %s"}],\n  "temperature" : 0.50,'
                ' "model" :  "%s" , "max_tokens": 7, "stream":false}' % (name, name, name)
                ).encode()
    for name in ("llama", "l3"):
        w.reset()
        raw = raw_body(name)
        want = raw.replace(b'"model" :  "%s" ,' % name.encode(),
                           b'"model" :  "%s" ,' % LLAMA.encode())
        assert want != raw and want.count(LLAMA.encode()) == 1
        resp = None
        for _ in range(2):  # round robin: one of two lands on the stub
            r = kv.post("/v1/chat/completions", content=raw)
            assert r.status_code == 200, (r.status_code, r.text[:300])
            if served_by(r) == w.url:
                resp = r
        assert resp is not None, "no request reached the stub target"
        (e,) = w.proxied()
        cl = header_value(e, "content-length")
        assert cl is not None and int(cl) == e["body_len"] == len(want), (cl, e["body_len"], len(want))
        assert e["body_sha256"] == hashlib.sha256(want).hexdigest(), \
            "the worker's body is not the client's with only the model value replaced"
        # the response is relayed unchanged (the upstream name stays in it)
        assert hashlib.sha256(resp.content).hexdigest() == e["resp_body_sha256"]
        assert resp.json()["model"] == LLAMA
    # a streamed request is rewritten the same way and its events relayed as sent
    w.reset()
    for _ in range(2):
        r = chat(kv, "l3", "streamed", stream=True)
        assert r.status_code == 200
        if served_by(r) == w.url:
            evs = parse_sse(r.content)
            assert evs[-1]["data"] == "[DONE]"
            assert json.loads(evs[0]["data"])["model"] == LLAMA
    (e,) = w.proxied()
    assert e["model"] == LLAMA and e["stream"] is True
    assert int(header_value(e, "content-length")) == e["body_len"]


def test_config_same_upstream_name_leaves_body_untouched(stub, kvroute, tmp_path):
    w = stub(model="plain")
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
workers: ["%s"]
routes:
  - model: plain
    targets: ["%s"]
""" % (w.url, w.url))
    kv, adm = start_config(kvroute, cfg)
    raw = b'{ "model" : "plain",  "messages":[{"role":"user","content":"x"}] ,"n":1}'
    r = kv.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200, r.text
    (e,) = w.proxied()
    assert e["body_sha256"] == hashlib.sha256(raw).hexdigest()
    assert int(header_value(e, "content-length")) == len(raw)
    rt = adm.route("plain")
    assert [(t["worker"], t["url"], t["model"]) for t in rt["targets"]] == [(w.url, w.url, "plain")]


def test_routes_keep_separate_sessions_and_prefixes(sim_factory, kvroute, tmp_path):
    s1 = sim_factory("--time-scale", "0")
    s2 = sim_factory("--time-scale", "0")
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
defaults: {policy: cache_aware}
workers:
  - {url: "%s", name: s1}
  - {url: "%s", name: s2}
routes:
  - name: r1
    targets: [{worker: s1, model: sim-model}, {worker: s2, model: sim-model}]
  - name: r2
    targets: [{worker: s1, model: sim-model}, {worker: s2, model: sim-model}]
""" % (s1.url, s2.url))
    kv, adm = start_config(kvroute, cfg)
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    msgs = [system, {"role": "user", "content": "Tell me about prefix caches, in detail. " * 3}]

    def send(route, messages, session=None):
        h = {"x-session-id": session} if session else None
        r = kv.post("/v1/chat/completions",
                    {"model": route, "messages": messages, "max_tokens": 8}, headers=h)
        assert r.status_code == 200, (route, r.status_code, r.text[:300])
        return r
    # a conversation taught on r1 (with a session)
    r = send("r1", msgs, "conv-1")
    owner = served_by(r)
    msgs2 = msgs + [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    r = send("r1", msgs2, "conv-1")
    assert r.headers["x-kvroute-decision"] == "session_id_match" and served_by(r) == owner
    r = send("r1", msgs2)  # r1 knows the prefix
    assert r.headers["x-kvroute-decision"] == "prefix_match", r.headers
    assert r.headers["x-kvroute-match"] == "1.00" and served_by(r) == owner, r.headers
    for i in range(2):
        send("r1", [{"role": "user", "content": "other session %d" % i}], "conv-%d" % (i + 2))
    rs = {x["name"]: x for x in adm.routes()["routes"]}
    assert rs["r1"]["sessions"] == 3 and rs["r1"]["index_blocks"] > 0, rs["r1"]
    assert rs["r2"]["sessions"] == 0 and rs["r2"]["index_blocks"] == 0, rs["r2"]
    m = kv.metrics()
    assert m.get("kvroute_sessions", model="r1") == 3, m.find("kvroute_sessions")
    assert m.get("kvroute_sessions", model="r2") == 0, m.find("kvroute_sessions")
    # r2 has learned nothing: the same messages match nothing there
    r = send("r2", msgs2)
    assert r.headers["x-kvroute-match"] == "0.00", r.headers
    assert r.headers["x-kvroute-decision"] != "prefix_match", r.headers
    # the session belongs to r1 only
    r = send("r2", [{"role": "user", "content": "on r2 now"}], "conv-1")
    assert r.headers["x-kvroute-decision"] != "session_id_match", r.headers
    m = kv.metrics()
    assert m.get("kvroute_sessions", model="r1") == 3, m.find("kvroute_sessions")
    assert m.get("kvroute_sessions", model="r2") == 1, m.find("kvroute_sessions")
    assert m.get("kvroute_decisions_total", model="r1", policy="cache_aware",
                 decision="session_id_match") == 1, m.find("kvroute_decisions_total")
    assert m.get("kvroute_decisions_total", model="r2", decision="session_id_match") == 0
    assert m.get("kvroute_decisions_total", model="r2") == 2
    assert not m.find("kvroute_sessions", model="sim-model"), \
        "metrics must be labelled by the route name, not the upstream name"


def test_v1_models_lists_every_route_and_alias(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
workers:
  - {url: "%s", name: w1}
  - {url: "%s", name: w2}
routes:
  - {name: one, aliases: [uno, eins], targets: [w1]}
  - {model: two, targets: [w1, w2]}
""" % (w1.url, w2.url))
    kv, adm = start_config(kvroute, cfg)
    assert model_ids(kv) == {"one", "uno", "eins", "two"}
    rs = adm.routes()
    assert isinstance(rs["generation"], int)
    byname = {x["name"]: x for x in rs["routes"]}
    assert set(byname) == {"one", "two"}
    assert byname["one"]["aliases"] == ["uno", "eins"], byname["one"]
    assert byname["two"]["aliases"] == []
    t = byname["one"]["targets"][0]
    for k in ("worker", "url", "model", "weight", "eligible", "inflight", "index_blocks",
              "sessions"):
        assert k in t, (k, t)
    assert (t["worker"], t["url"], t["model"]) == ("w1", w1.url, "one"), t
    for name in ("one", "uno", "eins"):
        r = chat(kv, name)
        assert r.status_code == 200 and served_by(r) == w1.url, (name, r.status_code)
    ws = adm.workers()
    assert sorted(ws[w1.url]["routes"]) == ["one", "two"] and ws[w2.url]["routes"] == ["two"], ws
    assert ws[w1.url]["name"] == "w1" and ws[w1.url]["weight"] == 1


def test_config_file_settings_and_command_line_precedence(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    file_port, admin_port = free_port(), free_port()
    cfg = write_config(tmp_path / "kvroute.yaml", """\
listen: {host: 127.0.0.1, port: %d}
admin: {host: 127.0.0.1, port: %d}
defaults: {policy: round_robin}
health_interval_ms: 0
retry_after: 7
workers:
  - {url: "%s", name: w1}
  - {url: "%s", name: w2}
routes:
  - {name: rr, targets: [w1, w2]}
  - {name: ll, policy: least_load, targets: [w1]}
""" % (file_port, admin_port, w1.url, w2.url))
    kv, _ = start_config(kvroute, cfg, admin=False)  # --port on the command line wins
    assert kv.port != file_port
    with pytest.raises(httpx.TransportError):
        httpx.get("http://127.0.0.1:%d/healthz" % file_port, timeout=1.0, verify=SSL_CTX)
    adm = Admin(admin_port)  # the admin listener comes from the file
    pol = {x["name"]: x["policy"] for x in adm.routes()["routes"]}
    assert pol == {"rr": "round_robin", "ll": "least_load"}, pol
    got = [served_by(chat(kv, "rr", "p %d" % i)) for i in range(4)]
    assert set(got) == {w1.url, w2.url} and got[0] != got[1], got
    r = adm.drain("w1")
    assert r.status_code == 200, r.text
    r = chat(kv, "ll")
    assert_openai_error(r, 503)
    assert r.headers.get("retry-after") == "7", r.headers  # retry_after: 7 from the file
    assert adm.drain("w1", on=False).status_code == 200


# ============================================================================ --check
def test_check_reports_every_error_with_its_position(procs, tmp_path):
    bad = write_config(tmp_path / "bad.yaml", """\
workers:
  - {url: "http://127.0.0.1:1", name: w1}
  - {url: "http://127.0.0.1:2", name: w2}
no_such_setting: 3
routes:
  - name: r1
    aliases: [dup]
    targets:
      - {worker: w1}
  - name: r2
    aliases: [dup]
    targets:
      - {worker: nosuch}
      - {worker: w2}
""")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", bad])
    assert rc == 1, (rc, out, err)
    lines = out.splitlines()
    assert len(lines) == 3, "want exactly 3 error lines on stdout, got:\n%s" % out
    pat = re.compile(LOC_RE % re.escape(str(bad)))
    locs = []
    for ln in lines:
        m = pat.match(ln)
        assert m, "not FILE:LINE:COL: message: %r" % ln
        locs.append(int(m.group(1)))
    # each error points at its own place: the unknown key (line 4), the route holding the
    # second 'dup' (its entry, line 10, or the alias itself, line 11), the unknown worker (13)
    by_line = dict(zip(locs, lines))
    assert len(by_line) == 3 and 4 in by_line and 13 in by_line, (locs, out)
    dup_line = next(n for n in by_line if n not in (4, 13))
    assert dup_line in (10, 11), (locs, out)
    assert "no_such_setting" in by_line[4], by_line[4]
    assert "dup" in by_line[dup_line], by_line[dup_line]
    assert "nosuch" in by_line[13], by_line[13]


def test_check_ok_summary(procs, tmp_path):
    good = write_config(tmp_path / "good.yaml", """\
listen: {host: 127.0.0.1, port: 9300}
defaults: {policy: cache_aware, cache_threshold: 0.5}
workers:
  - {url: "http://127.0.0.1:9101", name: w1, weight: 1}
  - "http://127.0.0.1:9102"
routes:
  - name: llama
    aliases: [l3]
    policy: round_robin
    targets:
      - {worker: w1, model: "meta-llama/Llama-3.1-8B-Instruct", weight: 1}
      - "http://127.0.0.1:9102"
  - model: other
    session_ttl: 60
    targets: [w1]
""")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", good])
    assert rc == 0, (rc, out, err)
    assert out.splitlines() == ["ok: %s: 2 routes, 2 workers, 3 targets" % good], out


def test_check_example_config(procs, tmp_path):
    if not EXAMPLE.exists():
        pytest.skip("docs/kvroute.example.yaml does not exist yet (being written)")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", EXAMPLE])
    assert rc == 0, "--check on the example failed (%d):\n%s%s" % (rc, out, err)
    assert re.match(r"^ok: %s: \d+ routes, \d+ workers, \d+ targets$" % re.escape(str(EXAMPLE)),
                    out.strip()), out


def test_check_refuses_a_worker_url_with_a_fragment(procs, tmp_path):
    """URL#r names a data-parallel rank: a configured URL may not carry a fragment."""
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--worker",
                                               "http://127.0.0.1:9001#1"])
    assert rc != 0, (out, err)
    assert "http://127.0.0.1:9001#1" in out + err and "malformed" in out + err, (out, err)


def test_check_refuses_redis_settings_without_a_redis(procs, tmp_path):
    """`redis: {}` or a key prefix without a url would leave sharing silently off."""
    for body, want in (("redis: {}\n", "redis: empty"),
                       ("redis: {key_prefix: \"x:\"}\n", "need --redis URL")):
        cfg = tmp_path / "r.yaml"
        cfg.write_text('workers: ["http://127.0.0.1:9001"]\n' + body)
        rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", cfg])
        assert rc != 0 and want in out + err, (body, out, err)


def test_example_config_mentions_every_flag(procs, tmp_path):
    if not EXAMPLE.exists():
        pytest.skip("docs/kvroute.example.yaml does not exist yet (being written)")
    rc, out, err = run_quick(procs, tmp_path, [KVROUTE_BIN, "--help"])
    flags = re.findall(r"^  --([a-z0-9][a-z0-9-]*)\b", out + err, re.M)
    assert len(flags) >= 30, (rc, out, err)
    text = EXAMPLE.read_text()
    missing = [f for f in flags
               if not re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(f.replace("-", "_")),
                                text)]
    assert not missing, "flags not in docs/kvroute.example.yaml: %s" % ", ".join(missing)


# ============================================================================ reload
def two_stub_config(ws, extra_routes="", aliases="[]"):
    return ("health_interval_ms: 0\nworkers:\n" + stub_workers_yaml(ws) +
            "routes:\n  - {name: m, aliases: %s, policy: round_robin, targets: [%s]}\n"
            % (aliases, ", ".join("{worker: %s, model: up-m}" % n for n, _ in ws)) + extra_routes)


def test_sighup_during_streams(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    ws = [("w1", w1), ("w2", w2)]
    cfg = write_config(tmp_path / "kvroute.yaml", two_stub_config(ws))
    kv, adm = start_config(kvroute, cfg)
    gen0 = adm.routes()["generation"]
    n = 20

    def stream(i):
        body = {"model": "m", "stream": True,
                "messages": [{"role": "user", "content": "stream %d" % i}]}
        with httpx.Client(timeout=15.0, verify=SSL_CTX) as c:
            with c.stream("POST", kv.url + "/v1/chat/completions", json=body,
                          headers={"x-stub-events": "10", "x-stub-interval-ms": "200"}) as r:
                data = b"".join(r.iter_bytes())
                return r.status_code, data, time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(stream, i) for i in range(n)]
        wait_until(lambda: len(in_progress(w1)) + len(in_progress(w2)) == n, 5, interval=0.05,
                   what="all 20 streams in progress at the workers")
        write_config(cfg, two_stub_config(ws, aliases="[m2]"))
        t_hup = time.monotonic()
        kv.proc.signal(signal.SIGHUP)
        wait_until(lambda: metric(kv, "kvroute_config_reloads_total", result="ok") == 1, 3,
                   interval=0.05, what="the SIGHUP reload to be applied")
        t_applied = time.monotonic()
        res = [f.result(timeout=15) for f in futs]
    for status, data, t_end in res:
        assert status == 200
        assert t_end > t_applied > t_hup, "a stream ended before the reload"
        evs = parse_sse(data)
        assert evs and evs[-1]["data"] == "[DONE]", "stream cut by the reload: %r" % data[-200:]
        content = [e for e in evs[:-1] if json.loads(e["data"])["choices"][0]["delta"].get("content")]
        assert len(content) == 10, data
    assert all(e["ended"] == "complete" for w in (w1, w2) for e in w.proxied())
    # the new config is in force
    assert adm.routes()["generation"] == gen0 + 1
    assert metric(kv, "kvroute_config_generation") == gen0 + 1
    r = chat(kv, "m2")
    assert r.status_code == 200, r.text
    assert "m2" in model_ids(kv)


def test_reload_removing_a_worker_lets_its_requests_finish(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", two_stub_config([("w1", w1), ("w2", w2)]))
    kv, adm = start_config(kvroute, cfg)
    ex, futs = slow_posts(kv, "m", 4, 3000, "slow")  # round robin: two on each worker
    try:
        wait_until(lambda: len(in_progress(w2)) == 2 and len(in_progress(w1)) == 2, 5,
                   interval=0.05, what="two slow requests in progress on each worker")
        write_config(cfg, two_stub_config([("w1", w1)]))
        r = adm.reload()
        assert r.status_code == 200, r.text
        assert r.json()["result"] == "ok"
        assert [t["url"] for t in adm.route("m")["targets"]] == [w1.url]
        for i in range(20):
            r = chat(kv, "m", "after removal %d" % i)
            assert r.status_code == 200, r.text
            assert served_by(r) == w1.url, "a removed worker got a new request"
        assert len(w2.proxied()) == 2, "the removed worker received new requests"
        assert len(in_progress(w2)) == 2, "the removed worker's requests did not run on"
        res = [f.result(timeout=10) for f in futs]
    finally:
        ex.shutdown(wait=True)
    assert all(r.status_code == 200 for r in res), [(r.status_code, r.text[:100]) for r in res]
    assert sorted(served_by(r) for r in res) == sorted([w1.url] * 2 + [w2.url] * 2)
    assert all(e["ended"] == "complete" for e in w2.proxied()), w2.proxied()
    assert len(w1.proxied()) == 22


def test_broken_reload_changes_nothing(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    ws = [("w1", w1), ("w2", w2)]
    good = two_stub_config(ws)
    cfg = write_config(tmp_path / "kvroute.yaml", good)
    kv, adm = start_config(kvroute, cfg)
    gen0 = adm.routes()["generation"]
    m0 = kv.metrics()
    assert m0.has("kvroute_config_generation"), m0.family_names()
    assert m0.types.get("kvroute_config_generation") == "gauge"
    assert m0.types.get("kvroute_config_reloads_total") == "counter"
    assert m0.get("kvroute_config_generation") == gen0
    assert m0.get("kvroute_config_reloads_total", result="error") == 0
    # drops route m, adds route n... and names an unknown worker: nothing of it may apply
    broken = ("health_interval_ms: 0\nworkers:\n" + stub_workers_yaml(ws) +
              "routes:\n  - {name: n, targets: [w1]}\n  - {name: k, targets: [ghost]}\n")
    write_config(cfg, broken)
    kv.proc.signal(signal.SIGHUP)
    wait_until(lambda: metric(kv, "kvroute_config_reloads_total", result="error") == 1, 3,
               interval=0.05, what="kvroute_config_reloads_total{result=error} to reach 1")
    assert kv.proc.alive()
    for i in range(10):
        r = chat(kv, "m", "still %d" % i)
        assert r.status_code == 200, r.text
    assert_openai_error(chat(kv, "n"), 404)
    assert model_ids(kv) == {"m"}
    assert adm.routes()["generation"] == gen0
    # POST /reload says why, and still changes nothing
    r = adm.reload()
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["result"] == "error" and body["errors"], body
    assert all(isinstance(e, str) for e in body["errors"])
    assert any("ghost" in e for e in body["errors"]), body
    m = kv.metrics()
    assert m.get("kvroute_config_reloads_total", result="error") == 2
    assert m.get("kvroute_config_reloads_total", result="ok") == 0
    assert m.get("kvroute_config_generation") == gen0
    # not even YAML
    write_config(cfg, "routes: [ {name: m, targets: [w1\n")
    assert adm.reload().status_code == 422
    assert chat(kv, "m").status_code == 200
    assert metric(kv, "kvroute_config_reloads_total", result="error") == 3


def test_post_reload_increments_generation(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    ws = [("w1", w1), ("w2", w2)]
    cfg = write_config(tmp_path / "kvroute.yaml", two_stub_config(ws))
    kv, adm = start_config(kvroute, cfg)
    gen0 = adm.routes()["generation"]
    assert metric(kv, "kvroute_config_generation") == gen0
    write_config(cfg, two_stub_config(ws, extra_routes="  - {name: extra, targets: [w2]}\n"))
    r = adm.reload()
    assert r.status_code == 200, r.text
    assert r.json() == {"result": "ok", "generation": gen0 + 1}, r.json()
    m = kv.metrics()
    assert m.get("kvroute_config_generation") == gen0 + 1
    assert m.get("kvroute_config_reloads_total", result="ok") == 1
    assert m.get("kvroute_config_reloads_total", result="error") == 0
    assert adm.routes()["generation"] == gen0 + 1
    assert model_ids(kv) == {"m", "extra"}
    r = chat(kv, "extra")
    assert r.status_code == 200 and served_by(r) == w2.url
    r = adm.reload()  # the same file again: still a new generation
    assert r.status_code == 200 and r.json()["generation"] == gen0 + 2, r.text
    assert metric(kv, "kvroute_config_reloads_total", result="ok") == 2


# ============================================================================ drain
def test_drain_and_undrain(stub, kvroute, tmp_path):
    w1, w2, w3 = stub(), stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
workers:
  - {url: "%s", name: w1}
  - {url: "%s", name: w2}
  - "%s"
routes:
  - {name: m, policy: round_robin, targets: [w1, w2, "%s"]}
""" % (w1.url, w2.url, w3.url, w3.url))
    kv, adm = start_config(kvroute, cfg)
    assert adm.workers()[w3.url]["name"] == w3.url  # a worker's name defaults to its URL
    ex, futs = slow_posts(kv, "m", 3, 1500, "held")  # round robin: one on each
    try:
        wait_until(lambda: len(in_progress(w2)) == 1, 5, interval=0.05,
                   what="a slow request in progress on w2")
        r = adm.drain("w2")
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["name"] == "w2" and d["url"] == w2.url and d["draining"] is True, d
        assert d["inflight"] == 1, d
        row = adm.workers()[w2.url]
        assert row["draining"] is True, row
        assert adm.workers()[w1.url]["draining"] is False
        for i in range(20):
            r = chat(kv, "m", "while draining %d" % i)
            assert r.status_code == 200, r.text
            assert served_by(r) != w2.url, "a draining worker got a new request"
        assert len(w2.proxied()) == 1
        res = [f.result(timeout=10) for f in futs]
    finally:
        ex.shutdown(wait=True)
    assert all(r.status_code == 200 for r in res), [r.status_code for r in res]
    assert w2.proxied()[0]["ended"] == "complete"
    wait_until(lambda: adm.workers()[w2.url]["inflight"] == 0, 3, what="w2 inflight 0")
    assert adm.workers()[w2.url]["draining"] is True  # drained stays drained when idle
    # undrain: it serves again
    r = adm.drain("w2", on=False)
    assert r.status_code == 200 and r.json()["draining"] is False, r.text
    assert adm.workers()[w2.url]["draining"] is False
    got = [served_by(chat(kv, "m", "back %d" % i)) for i in range(20)]
    assert got.count(w2.url) >= 1, "an undrained worker gets no requests: %r" % got
    # by percent-encoded URL (the name of a worker configured as a plain URL)
    enc = urllib.parse.quote(w3.url, safe="")
    assert "%3A" in enc and "%2F" in enc
    r = adm.drain(enc)
    assert r.status_code == 200, r.text
    assert r.json() == {"name": w3.url, "url": w3.url, "draining": True, "inflight": 0}, r.json()
    assert adm.workers()[w3.url]["draining"] is True
    n3 = len(w3.proxied())
    for i in range(20):
        r = chat(kv, "m", "w3 drained %d" % i)
        assert r.status_code == 200 and served_by(r) != w3.url
    assert len(w3.proxied()) == n3
    r = adm.drain(enc, on=False)
    assert r.status_code == 200 and r.json()["draining"] is False, r.text
    got = [served_by(chat(kv, "m", "w3 back %d" % i)) for i in range(6)]
    assert w3.url in got, got
    # an unknown worker
    assert adm.drain("nobody").status_code == 404


# ============================================================================ errors
def test_unknown_model_and_route_without_eligible_target(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", """\
health_interval_ms: 0
workers:
  - {url: "%s", name: w1}
  - {url: "%s", name: w2}
routes:
  - {name: solo, targets: [w1]}
  - {name: duo, policy: round_robin, targets: [w1, w2]}
""" % (w1.url, w2.url))
    kv, adm = start_config(kvroute, cfg)
    r = chat(kv, "no-such-model")
    err = assert_openai_error(r, 404)
    assert err["code"] == "model_not_found", err
    r = kv.post("/v1/completions", {"model": "no-such-model", "prompt": "x"})
    assert assert_openai_error(r, 404)["code"] == "model_not_found"
    assert chat(kv, "solo").status_code == 200
    assert adm.drain("w1").status_code == 200
    r = chat(kv, "solo")
    assert_openai_error(r, 503)
    ra = r.headers.get("retry-after")
    assert ra is not None and ra.isdigit() and int(ra) >= 1, r.headers
    rt = adm.route("solo")
    assert [t["eligible"] for t in rt["targets"]] == [False], rt
    # the other route still has w2
    for i in range(4):
        r = chat(kv, "duo", "duo %d" % i)
        assert r.status_code == 200 and served_by(r) == w2.url, (r.status_code, r.headers)
    assert len(w1.proxied()) == 1
    assert adm.drain("w1", on=False).status_code == 200
    assert chat(kv, "solo").status_code == 200


# ============================================================================ found by a break-it pass
def test_escaped_model_key_is_rewritten(stub, kvroute, tmp_path):
    """`"mod\\u0065l"` is `model` to every JSON parser: it is rewritten like the plain key."""
    w1, w2 = stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", two_stub_config([("w1", w1), ("w2", w2)]))
    kv, _ = start_config(kvroute, cfg, admin=False)
    for body in (b'{"mod\\u0065l":"m","messages":[{"role":"user","content":"x"}]}',
                 b'{"\\u006dodel":"m","messages":[{"role":"user","content":"y"}]}'):
        r = kv.post("/v1/chat/completions", content=body)
        assert r.status_code == 200, r.text
    sent = [e["model"] for w in (w1, w2) for e in w.proxied()]
    assert sent == ["up-m", "up-m"], sent


def test_config_without_workers_is_refused(procs, tmp_path):
    empty = write_config(tmp_path / "empty.yaml", "")
    rc, out, _ = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", empty])
    assert rc == 1 and re.match(r"^%s:1:1: no workers" % re.escape(str(empty)), out), out


def test_post_reload_without_a_config_file_is_refused(stub, kvroute):
    # As SIGHUP: nothing to re-read, nothing changes (a worker added at run time stays).
    w1, w2 = stub(), stub()
    port = free_port()
    kv = kvroute([w1], extra=["--admin-port", str(port)])
    adm = Admin(port)
    r = adm.post("/workers", {"url": w2.url, "name": "two"})
    assert r.status_code == 201, r.text
    r = adm.reload()
    assert r.status_code == 409, r.text
    assert r.json()["errors"] == ["no --config file to reload"], r.json()
    assert set(adm.workers()) == {w1.url, w2.url}
    assert metric(kv, "kvroute_config_reloads_total", result="ok") == 0


def test_reload_of_an_empty_file_is_refused(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    cfg = write_config(tmp_path / "kvroute.yaml", two_stub_config([("w1", w1), ("w2", w2)]))
    kv, adm = start_config(kvroute, cfg)
    write_config(cfg, "")
    r = adm.reload()
    assert r.status_code == 422, r.text
    assert chat(kv, "m").status_code == 200


def test_worker_restored_by_a_reload_keeps_its_inflight(stub, kvroute, tmp_path):
    w1, w2 = stub(), stub()
    full = two_stub_config([("w1", w1), ("w2", w2)])
    cfg = write_config(tmp_path / "kvroute.yaml", full)
    kv, adm = start_config(kvroute, cfg)
    ex, futs = slow_posts(kv, "m", 4, 2500, "slow")
    try:
        wait_until(lambda: len(in_progress(w2)) == 2, 5, interval=0.05, what="2 on w2")
        write_config(cfg, two_stub_config([("w1", w1)]))
        assert adm.reload().status_code == 200
        write_config(cfg, full)
        assert adm.reload().status_code == 200
        ws = adm.workers()
        assert ws[w2.url]["inflight"] == 2, ws[w2.url]
        res = [f.result(timeout=10) for f in futs]
    finally:
        ex.shutdown(wait=True)
    assert all(r.status_code == 200 for r in res)


def test_config_that_is_not_a_regular_file_is_refused(procs, tmp_path):
    import os
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    rc, out, _ = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", fifo],
                           timeout=5.0)
    assert rc == 1 and ":0:0: cannot read" in out, out


def test_deeply_nested_config_is_refused_quickly(procs, tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("routes: " + "[" * 40000 + "]" * 40000 + "\n")
    t = time.monotonic()
    rc, out, _ = run_quick(procs, tmp_path, [KVROUTE_BIN, "--check", "--config", deep])
    assert rc == 1 and "nested deeper than" in out, out
    assert time.monotonic() - t < 2.0
