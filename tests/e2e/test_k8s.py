"""Kubernetes discovery (issue 20): workers from the EndpointSlices of a Service, listed then
watched over HTTPS from a stub API server (tests/e2e/k8s_stub.py) with a CA made here."""
import json
import signal
import subprocess
import time

import httpx
import pytest

from conftest import (KVROUTE_BIN, MODEL, SIM_MODEL, SSL_CTX, RawConn, chat_body, free_port,
                      http_post, wait_until)
from k8s_stub import K8sStub, endpoint

SVC = "vllm"
P = "/v1/chat/completions"


@pytest.fixture
def api(tmp_path):
    d = tmp_path / "k8s"
    d.mkdir()
    s = K8sStub(d)
    s.token_file = d / "token"
    s.token_file.write_text("  %s\n" % s.token)  # surrounding whitespace is trimmed
    yield s
    s.stop()


def k8s_flags(api, admin_port, *more):
    return ["--k8s-service", SVC, "--k8s-namespace", "default", "--k8s-api-url", api.url,
            "--k8s-token-file", str(api.token_file), "--k8s-ca-file", str(api.ca),
            "--k8s-backoff-max-ms", 300, "--admin-port", admin_port, "--health-interval-ms", 0,
            *more]


def workers(kv, admin_port):
    r = httpx.get("http://127.0.0.1:%d/workers" % admin_port, timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 200, r.text
    return {w["url"]: w for w in r.json()["workers"]}


def slice_for(api, name, w, **cond):
    """Puts stub/sim `w` alone in slice `name` (each test worker listens on its own port, and
    an EndpointSlice's ports apply to all its endpoints)."""
    api.set_slice(name, SVC, [endpoint("pod-%s" % name, **cond)], w.port)


def served_by(kv, n=12, **body):
    seen = set()
    for _ in range(n):
        r = kv.chat(**body)
        assert r.status_code == 200, r.text
        seen.add(r.headers["x-kvroute-worker"])
    return seen


def hdr(headers, name):
    if isinstance(headers, dict):
        return headers.get(name)
    return next((v for k, v in headers if k.lower() == name), None)


def metric(kv, name, **labels):
    return sum(v for lb, v in kv.metrics().find(name)
               if all(lb.get(k) == x for k, x in labels.items()))


def test_slices_drive_the_fleet(api, stub, kvroute):
    a, b, c = stub(), stub(), stub()
    slice_for(api, "s-a", a)
    slice_for(api, "s-b", b)
    admin = free_port()
    t0 = time.monotonic()
    kv = kvroute([], extra=k8s_flags(api, admin), wait_ready=False)
    kv.wait_ready()
    wait_until(lambda: {a.url, b.url} <= set(workers(kv, admin)), 1.0,
               what="both ready endpoints to be workers within 1 s")
    assert time.monotonic() - t0 < 3.0
    ws = workers(kv, admin)
    assert ws[a.url]["name"] == "pod-s-a" and ws[a.url]["source"] == "kubernetes", ws[a.url]
    assert served_by(kv) == {a.url, b.url}
    first = api.requests("list")[0]
    assert first["auth"] == "Bearer " + api.token and first["service"] == SVC
    wait_until(lambda: api.requests("watch"), 2.0, what="a watch after the list")
    w0 = api.requests("watch")[0]
    assert w0["bookmarks"] == "true" and w0["rv"] == "102", w0
    assert metric(kv, "kvroute_discovery_workers", source="kubernetes") == 2
    # the watch owns them: the admin API cannot delete one
    r = httpx.delete("http://127.0.0.1:%d/workers/pod-s-a" % admin, timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 409, r.text

    # a third one, added ready, gets requests within a second
    slice_for(api, "s-c", c)
    wait_until(lambda: c.url in served_by(kv, n=6), 1.0, interval=0.05,
               what="the third endpoint to get requests")

    # one marked terminating (still serving): no new requests, its in-flight stream finishes
    body = json.dumps(chat_body(stream=True)).encode()
    conn = None
    for _ in range(6):  # round robin: one of the first few lands on `a`
        cn = RawConn(kv.port, timeout=10)
        cn.send(http_post(kv.port, P, body, ["x-stub-events: 8", "x-stub-interval-ms: 150"]))
        head = cn.read_head(timeout=5)
        assert head and head[0] == 200
        if hdr(head[3], "x-kvroute-worker") == a.url:
            conn = (cn, head)
            break
        list(cn.iter_sse(head[3], timeout=10))
        cn.close()
    assert conn, "no stream landed on the worker to terminate"
    cn, head = conn
    slice_for(api, "s-a", a, ready=False, serving=True, terminating=True)
    wait_until(lambda: workers(kv, admin)[a.url]["draining"], 1.0, interval=0.05,
               what="the terminating endpoint to be draining")
    n_before = len(a.proxied())
    assert a.url not in served_by(kv, n=9), "a terminating worker got new requests"
    assert len(a.proxied()) == n_before
    evs = [ev["data"] for _, ev, _ in cn.iter_sse(head[3], timeout=10)]
    assert cn.body_complete and evs[-1] == "[DONE]", evs[-3:]
    cn.close()

    # deleted → gone from /workers
    api.delete_slice("s-b")
    wait_until(lambda: b.url not in workers(kv, admin), 1.0, interval=0.05,
               what="the deleted endpoint to leave /workers")
    assert served_by(kv, n=6) == {c.url}
    assert metric(kv, "kvroute_discovery_errors_total", source="kubernetes") == 0


def test_watch_closed_then_410_relists_without_missing_a_change(api, stub, kvroute):
    a, b, c, d = stub(), stub(), stub(), stub()
    slice_for(api, "s-a", a)
    admin = free_port()
    kv = kvroute([], extra=k8s_flags(api, admin))
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the first worker")
    wait_until(lambda: api.requests("watch"), 2.0, what="the watch")
    # the server closes the watch; a change made meanwhile is not missed (resumed from its rv)
    api.close_watches()
    slice_for(api, "s-b", b)
    wait_until(lambda: b.url in workers(kv, admin), 2.0, what="the change made while resuming")
    assert len(api.requests("list")) == 1, "a closed watch is resumed, not relisted"
    # every rv so far too old: the next watch gets an ERROR event with a 410 Status → relist
    api.gone_mode = "event"
    api.compact()
    slice_for(api, "s-c", c)
    api.close_watches()
    wait_until(lambda: c.url in workers(kv, admin), 3.0, what="the change after a 410 event")
    # (the change may come through the watch still open before the close: the relist follows)
    wait_until(lambda: len(api.requests("list")) == 2, 3.0, what="a relist after the 410 event")
    # the same as an HTTP 410 status
    api.gone_mode = "status"
    api.compact()
    api.delete_slice("s-a")
    slice_for(api, "s-d", d)
    api.close_watches()
    wait_until(lambda: d.url in workers(kv, admin) and a.url not in workers(kv, admin), 3.0,
               what="the changes after a 410 status")
    wait_until(lambda: len(api.requests("list")) == 3, 3.0, what="a relist after HTTP 410")
    assert served_by(kv, n=9) == {b.url, c.url, d.url}
    assert metric(kv, "kvroute_discovery_errors_total", source="kubernetes") == 0


def test_token_rotation_and_refused_token(api, stub, kvroute):
    a, b, c = stub(), stub(), stub()
    slice_for(api, "s-a", a)
    admin = free_port()
    kv = kvroute([], extra=k8s_flags(api, admin))
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the first worker")
    wait_until(lambda: api.requests("watch"), 2.0, what="the watch")
    # rotated token: the next call uses it
    api.token_file.write_text("token-2\n")
    api.token = "token-2"
    n = len(api.log)
    api.close_watches()
    slice_for(api, "s-b", b)
    wait_until(lambda: b.url in workers(kv, admin), 2.0, what="a change seen with the new token")
    assert all(e["auth"] == "Bearer token-2" for e in api.log[n:]), api.log[n:]
    assert metric(kv, "kvroute_discovery_errors_total", source="kubernetes") == 0
    # a wrong token: 401 from the stub, workers unchanged, errors counted
    api.token = "token-3"  # the file still says token-2
    api.close_watches()
    slice_for(api, "s-c", c)  # not seen while refused
    wait_until(lambda: metric(kv, "kvroute_discovery_errors_total", source="kubernetes") >= 2,
               3.0, what="kvroute_discovery_errors_total to rise")
    assert any(e["status"] == 401 for e in api.log[n:])
    ws = workers(kv, admin)
    assert set(ws) == {a.url, b.url}, ws.keys()
    assert served_by(kv, n=6) == {a.url, b.url}
    assert "kubernetes discovery failed" in kv.proc.stderr_text()
    assert kv.proc.stderr_text().count("kubernetes discovery failed") == 1, "logged once per state"
    # the token fixed: back in sync
    api.token_file.write_text("token-3")
    wait_until(lambda: c.url in workers(kv, admin), 3.0, what="recovery after the token fix")


def test_models_from_discovered_workers(api, sim_factory, kvroute):
    """Without --model the discovered workers' /v1/models decide the routes, read at once."""
    s1, s2 = sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")
    slice_for(api, "s-1", s1)
    slice_for(api, "s-2", s2)
    admin = free_port()
    kv = kvroute([], model=None, extra=k8s_flags(api, admin), wait_ready=False)
    kv.wait_ready()
    wait_until(lambda: kv.get("/readyz").status_code == 200, 1.5, interval=0.05,
               what="/readyz once the discovered workers' models are read")
    assert served_by(kv, n=8, model=SIM_MODEL) == {s1.url, s2.url}
    models = [m["id"] for m in kv.get("/v1/models").json()["data"]]
    assert models == [SIM_MODEL]


def test_egress_policy_applies_to_discovered_workers(api, stub, kvroute, tmp_path):
    a = stub()
    slice_for(api, "s-a", a)
    api.set_slice("s-x", SVC, [endpoint("pod-x", ip="10.1.2.3")], 8000)
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("egress:\n  allow: [127.0.0.1]\n")
    admin = free_port()
    kv = kvroute([], extra=k8s_flags(api, admin, "--config", cfg))
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the allowed worker")
    time.sleep(0.3)
    assert "http://10.1.2.3:8000" not in workers(kv, admin)
    assert "refused by the egress policy" in kv.proc.stderr_text()


def test_out_of_cluster_without_api_url_fails_clearly(tmp_path):
    p = subprocess.run([str(KVROUTE_BIN), "--k8s-service", SVC, "--model", MODEL, "--port",
                        str(free_port()), "--shutdown-delay-ms", "0"],
                       capture_output=True, text=True, timeout=10,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "KUBERNETES_SERVICE_HOST" in p.stderr


def test_config_file_discovery_section(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("model: m\ndiscovery:\n  kubernetes:\n    service: vllm\n"
                    "    namespace: llm\n    port: http\n")
    p = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(good)],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 0, p.stdout + p.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\ndiscovery:\n  kubernetes:\n    servce: vllm\n")
    p = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(bad)],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 1 and "servce" in p.stdout, p.stdout
    upper = tmp_path / "upper.yaml"
    upper.write_text("model: m\ndiscovery:\n  kubernetes:\n    service: My_Service\n")
    p = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(upper)],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 1 and "My_Service" in p.stdout, p.stdout


def test_check_refuses_ports_that_are_not_ports(tmp_path):
    """--check (and the start) refuse a port that no EndpointSlice can name: out of range,
    zero, negative, or a name Kubernetes would refuse; numbers and IANA names pass."""
    def check(extra_yaml="", flags=()):
        f = tmp_path / "k.yaml"
        f.write_text("model: m\ndiscovery:\n  kubernetes:\n    service: vllm\n" + extra_yaml)
        return subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(f), *flags],
                              capture_output=True, text=True, timeout=10)
    for bad in ("99999", "0", "-3", "Http", "a--b", "-http", "sixteen-letters-x"):
        p = check("    port: \"%s\"\n" % bad)
        assert p.returncode == 1 and "not a port" in p.stdout and bad in p.stdout, (bad, p.stdout)
    p = check("    kv_events_port: \"-3\"\n")
    assert p.returncode == 1 and "--k8s-kv-events-port" in p.stdout, p.stdout
    p = check(flags=("--k8s-port", "0"))
    assert p.returncode == 1 and "--k8s-port" in p.stdout, p.stdout
    for good in ("8000", "65535", "http", "kv-events", "h2c"):
        p = check("    port: \"%s\"\n" % good)
        assert p.returncode == 0, (good, p.stdout + p.stderr)


def test_k8s_worker_survives_sigterm_drain(api, stub, kvroute):
    """A discovered fleet drains like any other (the watch is stopped cleanly)."""
    a = stub()
    slice_for(api, "s-a", a)
    admin = free_port()
    kv = kvroute([], extra=k8s_flags(api, admin))
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the worker")
    wait_until(lambda: api.requests("watch"), 2.0, what="the watch")
    kv.proc.signal(signal.SIGTERM)
    assert kv.proc.wait(5.0) == 0


def test_reload_keeps_discovered_workers(api, stub, kvroute, tmp_path):
    a, b = stub(), stub()
    slice_for(api, "s-a", a)
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("retry_after: 1\n")
    admin = free_port()
    kv = kvroute([], extra=k8s_flags(api, admin, "--config", cfg))
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the worker")
    cfg.write_text("retry_after: 2\n")
    kv.proc.signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in kv.proc.stderr_text(), 3.0, what="the reload")
    assert a.url in workers(kv, admin), "a reload dropped a discovered worker"
    assert served_by(kv, n=3) == {a.url}
    slice_for(api, "s-b", b)  # the watch goes on after the reload
    wait_until(lambda: b.url in workers(kv, admin), 2.0, what="a change after the reload")


def test_kv_event_ports_from_the_slices(api, sim_factory, kvroute):
    """--k8s-kv-events-port / --k8s-kv-replay-port name ports of the slices: a discovered
    worker gets its KV events (precise routing), exact once they flow."""
    pub, rep = free_port(), free_port()
    s = sim_factory("--time-scale", "0", "--kv-events-bind", "bind",
                    "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                    "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep)
    with api.lock:
        api.rv += 1
        api.slices["s-1"] = {
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "s-1", "namespace": "default", "resourceVersion": str(api.rv),
                         "labels": {"kubernetes.io/service-name": SVC}},
            "addressType": "IPv4", "endpoints": [endpoint("sim-0")],
            "ports": [{"name": "http", "port": s.port}, {"name": "kv-events", "port": pub},
                      {"name": "kv-replay", "port": rep}]}
    admin = free_port()
    kv = kvroute([], model=SIM_MODEL, policy="precise",
                 extra=k8s_flags(api, admin, "--k8s-port", "http", "--k8s-kv-events-port",
                                 "kv-events", "--k8s-kv-replay-port", "kv-replay"))
    wait_until(lambda: s.url in workers(kv, admin), 2.0, what="the discovered worker")
    assert workers(kv, admin)[s.url]["kv_events"] is not None, "no KV events configured"
    body = {"messages": [{"role": "user", "content": "tell me about kv events " * 20}]}
    for _ in range(3):
        r = kv.chat(model=SIM_MODEL, **body)
        assert r.status_code == 200, r.text
    wait_until(lambda: workers(kv, admin)[s.url]["kv_blocks"]["GPU"] > 0, 5.0, interval=0.05,
               what="blocks from the discovered worker's KV events")
    assert workers(kv, admin)[s.url]["kv_events"] == "exact"


def test_one_service_per_route(api, stub, kvroute, tmp_path):
    """routes[].service binds a route to a Service: its workers are that route's targets only."""
    a1, a2, b1 = stub(model="model-a"), stub(model="model-a"), stub(model="model-b")
    api.set_slice("a-1", "svc-a", [endpoint("a-1")], a1.port)
    api.set_slice("a-2", "svc-a", [endpoint("a-2")], a2.port)
    api.set_slice("b-1", "svc-b", [endpoint("b-1")], b1.port)
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("routes:\n  - {name: model-a, service: svc-a, policy: round_robin}\n"
                   "  - {name: model-b, service: svc-b, policy: round_robin}\n")
    p = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 0, p.stdout + p.stderr
    admin = free_port()
    flags = [f for f in k8s_flags(api, admin, "--config", cfg)]
    i = flags.index("--k8s-service")
    del flags[i:i + 2]  # the services come from the routes
    kv = kvroute([], model=None, policy=None, extra=flags)
    wait_until(lambda: {a1.url, a2.url, b1.url} <= set(workers(kv, admin)), 2.0,
               what="the workers of both services")
    assert served_by(kv, n=6, model="model-a") == {a1.url, a2.url}
    assert served_by(kv, n=4, model="model-b") == {b1.url}
    assert {x["url"]: x["routes"] for x in workers(kv, admin).values()}[b1.url] == ["model-b"]
    lists = {e["service"] for e in api.requests("list")}
    assert lists == {"svc-a", "svc-b"}, lists


def test_no_token_no_namespace_out_of_cluster(api, stub, kvroute, tmp_path):
    """Without a service-account token or namespace (out of a pod): unauthenticated calls in
    namespace `default`; an explicit token file that cannot be read stops the start."""
    a = stub()
    slice_for(api, "s-a", a)
    api.token = None  # this API server lets anyone read
    admin = free_port()
    flags = k8s_flags(api, admin)
    for f in ("--k8s-token-file", "--k8s-namespace"):
        i = flags.index(f)
        del flags[i:i + 2]
    kv = kvroute([], extra=flags)
    wait_until(lambda: a.url in workers(kv, admin), 2.0, what="the worker")
    assert api.requests("list")[0]["auth"] is None
    assert "using default" in kv.proc.stderr_text()
    p = subprocess.run([str(KVROUTE_BIN), "--model", MODEL, "--port", str(free_port()),
                        "--k8s-service", SVC, "--k8s-api-url", api.url, "--k8s-token-file",
                        str(tmp_path / "missing"), "--shutdown-delay-ms", "0"],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "k8s-token-file" in p.stderr, (p.returncode, p.stderr)
