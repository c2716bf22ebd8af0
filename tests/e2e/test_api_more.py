"""The rest of the API a fleet serves: embeddings, rerank, score, tokenize, pooling and classify
routed by model; stored responses (GET/DELETE /v1/responses/{id}, cancel, input_items) sent to
the worker holding them; unknown /v1/ paths never forwarded; and the admin listener's runtime
worker changes (POST /workers, PATCH and DELETE /workers/{name}), which last until a reload."""
import concurrent.futures
import json
import threading
import time

import httpx
import pytest

from conftest import (SIM_MODEL, SSL_CTX, assert_openai_error, free_port, wait_until)


# ============================================================================ helpers
class Admin:
    def __init__(self, port, token=None):
        self.base = "http://127.0.0.1:%d" % port
        self.token = token

    def call(self, method, path, body=None, auth=True, raw=None):
        h = {"content-type": "application/json"}
        if auth and self.token:
            h["authorization"] = "Bearer " + self.token
        content = raw if raw is not None else (json.dumps(body).encode()
                                               if body is not None else None)
        return httpx.request(method, self.base + path, content=content, headers=h, timeout=10.0,
                             verify=SSL_CTX)

    def workers(self):
        r = self.call("GET", "/workers")
        assert r.status_code == 200, r.text
        return {w["url"]: w for w in r.json()["workers"]}

    def route(self, name):
        r = self.call("GET", "/routes")
        assert r.status_code == 200, r.text
        return {x["name"]: x for x in r.json()["routes"]}[name]


def start(kvroute, sims, policy="cache_aware", model=SIM_MODEL, token=None, tmp_path=None,
          extra=()):
    port = free_port()
    args = ["--admin-port", port] + list(extra)
    if token is not None:
        f = tmp_path / "admin-token"
        f.write_text(token)
        args += ["--admin-token-file", str(f)]
    kv = kvroute(sims, model=model, policy=policy, extra=args)
    return kv, Admin(port, token)


def post(url, path, body, headers=None, timeout=10.0):
    h = {"content-type": "application/json"}
    h.update(headers or {})
    return httpx.post(url + path, content=json.dumps(body).encode(), headers=h,
                      timeout=timeout, verify=SSL_CTX)


def chat(kv, content, max_tokens=4, **kw):
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens}
    body.update(kw)
    return kv.post("/v1/chat/completions", body)


def without_created(obj):
    obj = dict(obj)
    obj.pop("created", None)
    return obj


# ============================================================================ embeddings, tokenize
EMBED_INPUTS = [
    "the quick brown fox",
    ["a first document", "a second, longer document about prefix caches"],
    [128000, 791, 4062],
    [[1, 2, 3], [4, 5]],
]


def test_embeddings_and_tokenize_match_the_sim(sim_factory, kvroute):
    """embeddings and tokenize answer through kvroute exactly as the sim answers them
    directly (embeddings bar `created`: the id follows from the inputs)."""
    sims = [sim_factory("--time-scale", "0") for _ in range(2)]
    kv, adm = start(kvroute, sims)
    for inp in EMBED_INPUTS:
        for extra in ({}, {"encoding_format": "base64"}, {"dimensions": 8}):
            body = dict({"model": SIM_MODEL, "input": inp}, **extra)
            via = kv.post("/v1/embeddings", body)
            assert via.status_code == 200, via.text
            worker = via.headers["x-kvroute-worker"]
            assert worker in {s.url for s in sims}
            direct = post(sims[0].url, "/v1/embeddings", body)  # any sim answers alike
            assert direct.status_code == 200, direct.text
            assert without_created(via.json()) == without_created(direct.json())
            got = via.json()
            assert got["object"] == "list" and got["model"] == SIM_MODEL
            assert [d["index"] for d in got["data"]] == list(range(len(got["data"])))
            assert got["usage"]["prompt_tokens"] == got["usage"]["total_tokens"] > 0
    # tokenize and detokenize: byte for byte, with and without a model (one route)
    for body in ({"model": SIM_MODEL, "prompt": "hello tokens"}, {"prompt": "hello tokens"},
                 {"prompt": "hi", "add_special_tokens": False, "return_token_strs": True},
                 {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}]}):
        via = kv.post("/tokenize", body)
        direct = post(sims[1].url, "/tokenize", body)
        assert via.status_code == direct.status_code == 200, (via.text, direct.text)
        assert via.content == direct.content
        ids = via.json()["tokens"]
        via = kv.post("/detokenize", {"tokens": ids})
        # a sim prints the pieces it has tokenized itself: ask the one kvroute asked
        direct = post(via.headers["x-kvroute-worker"], "/detokenize", {"tokens": ids})
        assert via.status_code == 200 and via.content == direct.content, via.text
    # the worker's own errors come back as it sent them
    r = kv.post("/v1/embeddings", {"model": SIM_MODEL, "input": "x", "dimensions": 0})
    assert_openai_error(r, 400)
    assert r.headers.get("x-kvroute-worker")
    m = kv.metrics()
    assert m.get("kvroute_requests_total", endpoint="/v1/embeddings", code="200") == 12
    assert m.get("kvroute_requests_total", endpoint="/tokenize", code="200") == 4
    assert m.get("kvroute_prompt_tokens_total") > 0  # embeddings usage is counted


def test_embeddings_route_by_their_input_text(sim_factory, kvroute):
    """cache_aware routes embeddings by their input text: the same long document goes back to
    the worker that embedded it."""
    sims = [sim_factory("--time-scale", "0") for _ in range(3)]
    kv, adm = start(kvroute, sims)
    doc = "a long shared document about routing by prefix " * 20
    first = kv.post("/v1/embeddings", {"model": SIM_MODEL, "input": doc})
    assert first.status_code == 200, first.text
    owner = first.headers["x-kvroute-worker"]
    for i in range(5):
        r = kv.post("/v1/embeddings", {"model": SIM_MODEL, "input": doc + " tail %d" % i})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvroute-worker"] == owner
        assert float(r.headers["x-kvroute-match"]) >= 0.9
    # tokenize does not fill a cache: it teaches nothing
    text = "tokenize-only text that no worker has embedded " * 20
    for _ in range(3):
        r = kv.post("/tokenize", {"model": SIM_MODEL, "prompt": text})
        assert r.status_code == 200 and float(r.headers["x-kvroute-match"]) == 0, r.headers


def test_other_endpoints_forwarded_by_model(stub, kvroute):
    """rerank, score, pooling and classify go to a worker of the route named by `model`,
    path and body unchanged; malformed ones are kvroute's 400s and reach no worker."""
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="round_robin")
    cases = [
        ("/v1/rerank", {"model": "stub-model", "query": "q", "documents": ["a", "b"]}),
        ("/rerank", {"model": "stub-model", "query": "q", "documents": ["a"], "top_n": 1}),
        ("/v1/score", {"model": "stub-model", "text_1": "a", "text_2": ["b", "c"]}),
        ("/pooling", {"model": "stub-model", "input": "x"}),
        ("/classify", {"model": "stub-model", "input": ["x", "y"]}),
        ("/v1/embeddings", {"model": "stub-model", "input": [1, 2]}),
    ]
    for path, body in cases:
        raw = json.dumps(body).encode()
        r = kv.post(path, content=raw)
        assert r.headers.get("x-kvroute-worker") in {w.url for w in ws}, (path, r.headers)
        url = r.headers["x-kvroute-worker"]
        w = next(w for w in ws if w.url == url)
        seen = [e for e in w.requests(path=path, prefix=None)]
        assert seen and seen[-1]["method"] == "POST", (path, seen)
        assert seen[-1]["body_len"] == len(raw)
    bad = [
        ("/v1/rerank", {"model": "stub-model", "documents": ["a"]}, "query"),
        ("/v1/embeddings", {"model": "stub-model"}, "input"),
        ("/v1/embeddings", {"input": "x"}, "model"),
        ("/classify", {"model": "stub-model", "input": {"x": 1}}, "input"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/v1/score", {"model": "stub-model", "text_1": 5}, "text_1"),
    ]
    before = sum(len(w.requests(prefix="/")) for w in ws)
    for path, body, param in bad:
        err = assert_openai_error(kv.post(path, body), 400)
        assert err["param"] == param, (path, err)
    err = assert_openai_error(kv.post("/v1/embeddings", {"model": "nope", "input": "x"}), 404)
    assert err["code"] == "model_not_found"
    r = kv.get("/v1/embeddings")
    assert r.status_code == 405 and r.headers.get("allow") == "POST"
    assert sum(len(w.requests(prefix="/")) for w in ws) == before


def test_tokenize_without_model_needs_a_single_route(sim_factory, kvroute):
    a = sim_factory("--time-scale", "0", model="a")
    b = sim_factory("--time-scale", "0", model="b")
    kv = kvroute([a, b], model=None, policy="round_robin")  # discovery: routes a and b
    wait_until(lambda: kv.post("/tokenize", {"model": "b", "prompt": "x"}).status_code == 200,
               10, what="route b")
    err = assert_openai_error(kv.post("/tokenize", {"prompt": "x"}), 400)
    assert err["param"] == "model"
    for name, sim in (("a", a), ("b", b)):
        r = kv.post("/tokenize", {"model": name, "prompt": "x"})
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == sim.url


# ============================================================================ stored responses
def test_get_response_reaches_the_worker_that_created_it(sim_factory, kvroute):
    """GET /v1/responses/{id} reaches the worker that created `id` on every try; DELETE goes
    there too; ids no worker holds are kvroute's own 404."""
    sims = [sim_factory("--time-scale", "0") for _ in range(3)]
    kv, adm = start(kvroute, sims, policy="round_robin")
    created = {}
    for i in range(6):
        body = {"model": SIM_MODEL, "input": "question %d" % i, "max_output_tokens": 4}
        if i % 2:
            body["stream"] = True
        r = kv.post("/v1/responses", body)
        assert r.status_code == 200, r.text
        if i % 2:
            line = next(ln for ln in r.text.splitlines() if ln.startswith("data: "))
            rid = json.loads(line[6:])["response"]["id"]
        else:
            rid = r.json()["id"]
        created[rid] = r.headers["x-kvroute-worker"]
    assert len(set(created.values())) == 3  # round robin spread them
    for rid, worker in created.items():
        for _ in range(4):
            r = kv.get("/v1/responses/" + rid)
            assert r.status_code == 200, r.text
            assert r.headers["x-kvroute-worker"] == worker
            got = r.json()
            assert got["id"] == rid and got["status"] == "completed"
            direct = httpx.get(worker + "/v1/responses/" + rid, timeout=5.0, verify=SSL_CTX)
            assert r.content == direct.content
        r = kv.get("/v1/responses/%s/input_items?limit=5" % rid)
        assert r.headers.get("x-kvroute-worker") == worker  # the sim serves no input_items
        r = kv.post("/v1/responses/%s/cancel" % rid, None, content=b"")
        assert r.headers.get("x-kvroute-worker") == worker
    rid, worker = next(iter(created.items()))
    r = httpx.delete(kv.url + "/v1/responses/" + rid, timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}
    assert r.headers["x-kvroute-worker"] == worker
    r = kv.get("/v1/responses/" + rid)  # deleted: the pin went with it, kvroute says 404
    assert_openai_error(r, 404)
    assert "x-kvroute-worker" not in r.headers
    # unknown, malformed, or the wrong method: kvroute answers, no worker is asked
    for path in ("/v1/responses/resp_0000000000000000deadbeef", "/v1/responses/..",
                 "/v1/responses/a%2Fb", "/v1/responses/x/other"):
        r = kv.get(path)
        err = assert_openai_error(r, 404)
        assert "x-kvroute-worker" not in r.headers, path
        if path.endswith("deadbeef"):
            assert err["message"] == "Response with id 'resp_0000000000000000deadbeef' not found."
    r = httpx.put(kv.url + "/v1/responses/" + rid, timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 405 and r.headers.get("allow") == "GET, DELETE"
    r = kv.get("/v1/responses/%s/cancel" % rid)
    assert r.status_code == 405 and r.headers.get("allow") == "POST"
    # ids never become metric labels
    m = kv.metrics()
    eps = {lb["endpoint"] for lb, _ in m.find("kvroute_requests_total")}
    assert not any("resp_" in e for e in eps), eps
    assert m.get("kvroute_requests_total", endpoint="/v1/responses/{id}", code="200") >= 24
    # reading a stored response again counts no new tokens
    prompt = m.get("kvroute_prompt_tokens_total")
    for rid in created:
        kv.get("/v1/responses/" + rid)
    assert kv.metrics().get("kvroute_prompt_tokens_total") == prompt


def test_a_streaming_response_is_pinned_from_its_first_event(sim_factory, kvroute):
    """Requests about a response go to its worker while it is still being written (a client
    may cancel it), not only once it ended."""
    sims = [sim_factory("--time-scale", "1") for _ in range(2)]
    kv, adm = start(kvroute, sims, policy="round_robin")
    body = {"model": SIM_MODEL, "input": "a long answer please", "max_output_tokens": 60,
            "stream": True}
    with httpx.stream("POST", kv.url + "/v1/responses", json=body, timeout=30.0,
                      verify=SSL_CTX) as r:
        assert r.status_code == 200
        worker = r.headers["x-kvroute-worker"]
        lines = r.iter_lines()
        rid = next(json.loads(ln[6:])["response"]["id"] for ln in lines
                   if ln.startswith("data: "))
        g = kv.get("/v1/responses/" + rid)  # the sim stores it when done: its own 404 now
        assert g.headers.get("x-kvroute-worker") == worker, (g.status_code, g.text)
        c = kv.post("/v1/responses/%s/cancel" % rid, content=b"")
        assert c.headers.get("x-kvroute-worker") == worker
        rest = list(lines)
    assert any("response.completed" in ln for ln in rest)
    g = kv.get("/v1/responses/" + rid)
    assert g.status_code == 200 and g.headers["x-kvroute-worker"] == worker, g.text


def test_unknown_v1_paths_are_404_and_never_forwarded(stub, kvroute):
    w = stub()
    kv = kvroute([w])
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/audio/transcriptions"),
                         ("POST", "/v1/chat/completions/x"), ("DELETE", "/v1/models"),
                         ("GET", "/v1/responses"), ("POST", "/v1/embeddings/extra"),
                         ("GET", "/v1/unknown/%s" % ("x" * 500))):
        r = httpx.request(method, kv.url + path, content=b"{}", timeout=5.0, verify=SSL_CTX)
        assert r.status_code in (404, 405), (method, path, r.status_code)
        assert_openai_error(r)
    assert w.requests(prefix="/v1/") == []
    eps = {lb["endpoint"] for lb, _ in kv.metrics().find("kvroute_requests_total")}
    assert "other" in eps and not any(e.startswith("/v1/unknown") for e in eps), eps


def test_client_keys_guard_the_new_endpoints(stub, kvroute, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice:sk-alice\n")
    w = stub()
    kv = kvroute([w], extra=["--api-key-file", str(keys)])
    for path, body in (("/tokenize", {"prompt": "x"}), ("/rerank", {"query": "q"}),
                       ("/v1/embeddings", {"input": "x"})):
        assert_openai_error(kv.post(path, body), 401)
    assert_openai_error(kv.get("/v1/responses/resp_x"), 401)
    r = kv.post("/pooling", {"model": "stub-model", "input": "x"},
                headers={"authorization": "Bearer sk-alice"})
    assert r.headers.get("x-kvroute-worker") == w.url
    logged = w.requests(path="/pooling", prefix=None)
    assert logged and all(k.lower() != "authorization" for k, _ in logged[-1]["headers"])


# ============================================================================ runtime workers
def test_post_workers_adds_a_sim_that_then_receives_traffic(sim_factory, kvroute):
    s1, s2 = sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")
    kv, adm = start(kvroute, [s1], policy="round_robin")
    r = adm.call("POST", "/workers", {"url": s2.url, "name": "extra", "role": "decode"})
    assert r.status_code == 201, r.text
    row = r.json()
    assert (row["url"], row["name"], row["source"], row["role"], row["weight"]) == \
        (s2.url, "extra", "api", "decode", 1.0)
    assert row["routes"] == [SIM_MODEL]
    seen = set()
    for i in range(6):
        resp = chat(kv, "hello %d" % i)
        assert resp.status_code == 200, resp.text
        seen.add(resp.headers["x-kvroute-worker"])
    assert seen == {s1.url, s2.url}
    ws = adm.workers()
    assert ws[s2.url]["source"] == "api" and ws[s1.url]["source"] == "config"
    assert ws[s1.url]["role"] == "both"
    assert ws[s2.url]["requests"] == 3
    assert {t["url"] for t in adm.route(SIM_MODEL)["targets"]} == {s1.url, s2.url}


def test_post_workers_reads_the_model_list_when_routes_are_not_given(sim_factory, kvroute):
    """Discovered routes: a new worker joins the routes of the models it lists, at once."""
    a1 = sim_factory("--time-scale", "0", model="a")
    b1 = sim_factory("--time-scale", "0", model="b")
    a2 = sim_factory("--time-scale", "0", model="a")
    kv, adm = start(kvroute, [a1, b1], model=None, policy="round_robin")
    wait_until(lambda: chat_model(kv, "a").status_code == 200, 10, what="route a")
    r = adm.call("POST", "/workers", {"url": a2.url})
    assert r.status_code == 201, r.text
    assert r.json()["routes"] == ["a"] and r.json()["name"] == a2.url
    served = {chat_model(kv, "a", "x %d" % i).headers["x-kvroute-worker"] for i in range(4)}
    assert served == {a1.url, a2.url}
    # an unreachable worker without routes cannot be placed: 502, nothing added
    dead = "http://127.0.0.1:%d" % free_port()
    err = assert_openai_error(adm.call("POST", "/workers", {"url": dead}), 502)
    assert "/v1/models" in err["message"]
    assert dead not in adm.workers()
    # with routes given it is added as asked, reachable or not
    r = adm.call("POST", "/workers", {"url": dead, "routes": ["b"], "weight": 0.5})
    assert r.status_code == 201 and r.json()["routes"] == ["b"], r.text


def chat_model(kv, model, content="hello"):
    return kv.post("/v1/chat/completions", {"model": model, "max_tokens": 2,
                                            "messages": [{"role": "user", "content": content}]})


def test_delete_worker_drains_and_removes_it_without_a_failed_request(sim_factory, kvroute):
    s1 = sim_factory("--time-scale", "1")  # ~0.2 s per request: some are always in flight
    s2 = sim_factory("--time-scale", "1")
    kv, adm = start(kvroute, [s1], policy="round_robin")
    assert adm.call("POST", "/workers", {"url": s2.url, "name": "temp"}).status_code == 201
    results, stop = [], threading.Event()

    def client(k):
        i = 0
        while not stop.is_set():
            stream = (i % 2) == 1
            r = chat(kv, "client %d request %d" % (k, i), max_tokens=24, stream=stream)
            results.append((r.status_code, r.headers.get("x-kvroute-worker"), stream,
                            "error" not in r.text if stream else True, time.monotonic()))
            i += 1
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(client, k) for k in range(4)]
        wait_until(lambda: adm.workers()[s2.url]["inflight"] > 0, 10,
                   what="requests in flight on the added worker")
        r = adm.call("DELETE", "/workers/temp")
        t_deleted = time.monotonic()
        assert r.status_code == 200, r.text
        assert r.json()["removed"] is True and r.json()["name"] == "temp"
        draining = r.json()["inflight"]
        time.sleep(2.0)
        stop.set()
        for f in futs:
            f.result(timeout=30)
    assert results and all(st == 200 and ok for st, _, _, ok, _ in results), \
        [x for x in results if x[0] != 200 or not x[3]][:5]
    # the in-flight ones finished on it; nothing later started there
    if draining:
        assert any(w == s2.url and t > t_deleted for _, w, _, _, t in results)
    later = [x for x in results if x[4] > t_deleted + 1.0]
    assert later and all(w == s1.url for _, w, _, _, _ in later)
    assert s2.url not in adm.workers()
    assert [t["url"] for t in adm.route(SIM_MODEL)["targets"]] == [s1.url]
    kv.wait_inflight_zero()
    assert s2.url not in kv.inflight()  # its gauges go once its requests ended
    # a configured worker is not deleted; an unknown one is 404
    assert_openai_error(adm.call("DELETE", "/workers/" + s1.url.replace(":", "%3A").replace(
        "/", "%2F")), 409)
    assert_openai_error(adm.call("DELETE", "/workers/temp"), 404)


def test_patch_worker_weight_and_drain(sim_factory, kvroute):
    s1, s2 = sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")
    kv, adm = start(kvroute, [s1, s2], policy="round_robin")
    name = s2.url
    r = adm.call("PATCH", "/workers/" + name, {"weight": 3})
    assert r.status_code == 200 and r.json()["weight"] == 3.0, r.text
    tg = {t["url"]: t["weight"] for t in adm.route(SIM_MODEL)["targets"]}
    assert tg == {s1.url: 1.0, s2.url: 3.0}
    r = adm.call("PATCH", "/workers/" + name, {"drain": True})
    assert r.status_code == 200 and r.json()["draining"] is True
    assert {chat(kv, "d %d" % i).headers["x-kvroute-worker"] for i in range(4)} == {s1.url}
    r = adm.call("PATCH", "/workers/" + name, {"draining": False, "weight": 1})
    assert r.json()["draining"] is False and r.json()["weight"] == 1.0
    assert {chat(kv, "u %d" % i).headers["x-kvroute-worker"] for i in range(4)} == \
        {s1.url, s2.url}
    for body in ({}, {"weight": 0}, {"weight": "2"}, {"drain": "yes"}, {"name": "x"}, [1]):
        assert_openai_error(adm.call("PATCH", "/workers/" + name, body), 400)
    assert_openai_error(adm.call("PATCH", "/workers/nobody", {"weight": 2}), 404)


def test_worker_admin_refusals_and_token(sim_factory, kvroute, tmp_path):
    s1, s2 = sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")
    kv, adm = start(kvroute, [s1], token="tok", tmp_path=tmp_path)
    assert adm.call("POST", "/workers", {"url": s2.url}, auth=False).status_code == 401
    assert adm.call("DELETE", "/workers/x", auth=False).status_code == 401
    for body in ({}, {"url": "ftp://x"}, {"url": s2.url, "weight": -1},
                 {"url": s2.url, "role": "leader"}, {"url": s2.url, "routes": "all"},
                 {"url": s2.url, "bogus": 1}):
        assert_openai_error(adm.call("POST", "/workers", body), 400)
    assert_openai_error(adm.call("POST", "/workers", raw=b"{not json"), 400)
    err = assert_openai_error(adm.call("POST", "/workers", {"url": 5}), 400)
    assert "'url' must be a string" in err["message"], err
    assert_openai_error(adm.call("POST", "/workers", {"url": s1.url + "/"}), 409)
    assert_openai_error(adm.call("POST", "/workers", {"url": s2.url, "name": s1.url}), 409)
    assert_openai_error(adm.call("POST", "/workers", {"url": s2.url, "routes": ["nope"]}), 422)
    assert list(adm.workers()) == [s1.url]
    r = adm.call("POST", "/workers", {"url": s2.url, "name": "two", "weight": 2,
                                      "routes": [SIM_MODEL]})
    assert r.status_code == 201, r.text
    assert_openai_error(adm.call("POST", "/workers", {"url": "http://127.0.0.1:1",
                                                      "name": "two"}), 409)
    assert adm.call("PUT", "/workers/two").status_code == 405
    assert_openai_error(adm.call("POST", "/workers/two/sideways"), 404)
    assert adm.call("POST", "/workers/two/drain").json()["draining"] is True
    assert {chat(kv, "s %d" % i).headers["x-kvroute-worker"] for i in range(3)} == {s1.url}


def test_runtime_workers_last_until_reload(sim_factory, kvroute, tmp_path):
    """Workers added at run time join the file's routes whose model they list, show as
    `source: api`, and are gone after a reload: the configuration is the whole fleet."""
    s1, s2 = sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")
    cfg = tmp_path / "kvroute.yaml"
    cfg.write_text("""\
health_interval_ms: 0
workers:
  - {url: "%s", name: one}
routes:
  - name: public
    policy: round_robin
    targets:
      - {worker: one, model: "%s"}
""" % (s1.url, SIM_MODEL))
    port = free_port()
    kv = kvroute([], model=None, policy=None,
                 extra=["--config", str(cfg), "--admin-port", str(port)])
    adm = Admin(port)
    r = adm.call("POST", "/workers", {"url": s2.url, "name": "two"})
    assert r.status_code == 201 and r.json()["routes"] == ["public"], r.text
    route = adm.route("public")
    assert {(t["worker"], t["model"]) for t in route["targets"]} == \
        {("one", SIM_MODEL), ("two", SIM_MODEL)}  # its model is the one it lists
    served = {chat_model(kv, "public", "r %d" % i).headers["x-kvroute-worker"]
              for i in range(4)}
    assert served == {s1.url, s2.url}
    r = adm.call("POST", "/reload")
    assert r.status_code == 200, r.text
    assert set(adm.workers()) == {s1.url}
    assert [t["worker"] for t in adm.route("public")["targets"]] == ["one"]
    assert_openai_error(adm.call("DELETE", "/workers/two"), 404)
