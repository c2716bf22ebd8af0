"""The admin listener (--admin-port, --admin-host, --admin-token-file): GET /workers and
POST /debug/route, which explains the decision kvroute would make now without forwarding or
teaching. Stub workers, so their request logs prove nothing was forwarded."""
import json

import httpx
import pytest

from conftest import (MODEL, SSL_CTX, RawConn, assert_openai_error, free_port, http_post,
                      wait_until)

RS, US, GS = "\x1e", "\x1f", "\x1d"


class Admin:
    def __init__(self, port, token=None):
        self.base = "http://127.0.0.1:%d" % port
        self.token = token

    def _h(self, headers, auth):
        h = {}
        if auth is True and self.token:
            h["authorization"] = "Bearer " + self.token
        elif isinstance(auth, str):
            h["authorization"] = auth
        h.update(headers or {})
        return h

    def get(self, path, auth=True, headers=None):
        return httpx.get(self.base + path, headers=self._h(headers, auth), timeout=5.0,
                         verify=SSL_CTX)

    def post(self, path, body=None, auth=True, headers=None, raw=None):
        content = raw if raw is not None else json.dumps(body).encode()
        h = {"content-type": "application/json"}
        h.update(self._h(headers, auth))
        return httpx.post(self.base + path, content=content, headers=h, timeout=5.0,
                          verify=SSL_CTX)

    def workers(self):
        r = self.get("/workers")
        assert r.status_code == 200, r.text
        return {w["url"]: w for w in r.json()["workers"]}

    def explain(self, body, headers=None, endpoint=None):
        path = "/debug/route" + ("?endpoint=%s" % endpoint if endpoint else "")
        r = self.post(path, body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()


def start(stub, kvroute, n=2, token=None, tmp_path=None, extra=(), health_interval_ms=0,
          policy="cache_aware"):
    ws = [stub() for _ in range(n)]
    port = free_port()
    args = ["--admin-port", port] + list(extra)
    if token is not None:
        f = tmp_path / "admin-token"
        f.write_text(token)
        args += ["--admin-token-file", str(f)]
    kv = kvroute(ws, policy=policy, health_interval_ms=health_interval_ms, extra=args)
    return ws, kv, Admin(port, token.strip() if token else None)


def chat(content, **extra):
    b = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    b.update(extra)
    return b


def chat_text_bytes(content):
    """Bytes of the routing text of one user message (keys.h framing: RS role US 'c' text GS)."""
    return len((RS + "user" + US + "c" + content + GS).encode())


def listening_addrs(port):
    """Local addresses (hex ip) listening on `port`, from /proc/net/tcp and tcp6."""
    out = set()
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(fn).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            ip, p = f[1].split(":")
            if int(p, 16) == port and f[3] == "0A":  # LISTEN
                out.add(ip)
    return out


def proxied(ws):
    return sum(len(w.proxied()) for w in ws)


# ============================================================================ listener and auth
def test_admin_is_off_by_default(stub, kvroute):
    w = stub()
    kv = kvroute([w], policy="cache_aware", health_interval_ms=0)
    assert "--admin-port" not in kv.argv
    # the data plane does not serve the admin paths
    assert kv.get("/workers").status_code == 404
    assert kv.post("/debug/route", chat("x")).status_code == 404


def test_admin_binds_loopback(stub, kvroute):
    ws, kv, adm = start(stub, kvroute, n=1)
    port = int(adm.base.rsplit(":", 1)[1])
    addrs = listening_addrs(port)
    assert addrs == {"0100007F"}, "admin listener not bound to 127.0.0.1 only: %r" % addrs
    assert adm.get("/workers").status_code == 200
    # an explicit --admin-host 127.0.0.1 works too
    p2 = free_port()
    kv2 = kvroute(ws, policy="cache_aware", health_interval_ms=0,
                  extra=["--admin-port", p2, "--admin-host", "127.0.0.1"])
    assert Admin(p2).get("/workers").status_code == 200
    assert listening_addrs(p2) == {"0100007F"}
    kv2.stop()


def test_admin_token_is_required(stub, kvroute, tmp_path):
    ws, kv, adm = start(stub, kvroute, token="  s3cret-Token.42 \n", tmp_path=tmp_path)
    tok = "s3cret-Token.42"
    bad = [False, "Bearer", "Bearer wrong", "Bearer " + tok[:-1], "Bearer " + tok + "x",
           "Bearer " + tok.upper(), "Basic " + tok, tok, "Bearer " + tok + " " + tok]
    for auth in bad:
        for r in (adm.get("/workers", auth=auth),
                  adm.post("/debug/route", chat("hello"), auth=auth)):
            assert r.status_code == 401, (auth, r.status_code, r.text[:200])
            assert_openai_error(r, 401)
            assert "bearer" in r.headers.get("www-authenticate", "").lower(), r.headers
    r = adm.get("/workers", auth="Bearer " + tok)
    assert r.status_code == 200, r.text
    r = adm.post("/debug/route", chat("hello"), auth="Bearer " + tok)
    assert r.status_code == 200, r.text
    # 401 before anything else: an unknown path without the token is 401, with it 404
    assert adm.get("/nope", auth=False).status_code == 401
    assert adm.get("/nope").status_code == 404
    # the data plane needs no token
    assert kv.post("/v1/chat/completions", chat("hi")).status_code == 200
    assert proxied(ws) == 1


@pytest.mark.parametrize("content", [None, "   \n\n"])
def test_unreadable_or_empty_token_file_refuses_to_start(stub, kvroute, tmp_path, content):
    w = stub()
    f = tmp_path / "token"
    if content is not None:
        f.write_text(content)
    kv = kvroute([w], policy="cache_aware", health_interval_ms=0, wait_ready=False,
                 check_inflight=False,
                 extra=["--admin-port", free_port(), "--admin-token-file", str(f)])
    rc = kv.proc.wait(5)
    assert rc is not None and rc != 0, "kvroute started with a %s token file" % (
        "missing" if content is None else "blank")
    assert "token" in kv.proc.stderr_text().lower()


def test_admin_methods_and_paths(stub, kvroute):
    ws, kv, adm = start(stub, kvroute)
    r = adm.post("/workers", {})  # POST /workers adds a worker: a URL is required
    assert_openai_error(r, 400)
    r = httpx.put(adm.base + "/workers", timeout=5.0, verify=SSL_CTX)
    assert r.status_code == 405 and r.headers.get("allow") == "GET, POST", r.text
    r = adm.get("/debug/route")
    assert r.status_code == 405, r.text
    assert adm.get("/v1/models").status_code == 404
    r = adm.post("/debug/route", raw=b"{not json")
    assert_openai_error(r, 400)
    r = adm.post("/debug/route?endpoint=embeddings", chat("x"))
    assert_openai_error(r, 400)
    r = adm.post("/debug/route", {"model": MODEL, "messages": "not a list"})
    assert_openai_error(r, 400)
    assert proxied(ws) == 0


# ============================================================================ GET /workers
def test_workers_lists_state_per_worker(stub, kvroute):
    # --forget-after-ms 0: a worker down at all counts as having lost its cache
    ws, kv, adm = start(stub, kvroute, health_interval_ms=100,
                        extra=["--forget-after-ms", "0", "--teach-completion-max-bytes", "0"])
    urls = {w.url for w in ws}
    r = adm.get("/workers")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    table = adm.workers()
    assert set(table) == urls  # URLs exactly as configured
    for w in table.values():
        for k in ("url", "eligible", "inflight", "index_blocks", "sessions"):
            assert k in w, (k, w)
        assert w["eligible"] is True and w["inflight"] == 0
        assert w["index_blocks"] == 0 and w["sessions"] == 0
    # teach one worker a session and a text
    text = "a text of several blocks for the worker table " * 4
    res = kv.post("/v1/chat/completions", chat(text), headers={"x-session-id": "tbl"})
    owner = res.headers["x-kvroute-worker"]
    other = next(u for u in urls if u != owner)
    table = adm.workers()
    assert table[owner]["sessions"] == 1 and table[other]["sessions"] == 0, table
    nblocks = -(-chat_text_bytes(text) // 64)
    assert table[owner]["index_blocks"] == nblocks, (nblocks, table[owner])
    assert table[other]["index_blocks"] == 0, table
    # in-flight: a request held at the owner
    conn = RawConn(kv.port, timeout=10)
    conn.send(http_post(kv.port, "/v1/chat/completions", chat("held"),
                        ["x-session-id: tbl", "x-stub-mode: json,delay:1500"]))
    try:
        wait_until(lambda: adm.workers()[owner]["inflight"] == 1, 3, what="inflight 1 in /workers")
        assert adm.workers()[other]["inflight"] == 0
    finally:
        resp = conn.read_response(timeout=10)
        conn.close()
    assert resp.status == 200
    wait_until(lambda: adm.workers()[owner]["inflight"] == 0, 3, what="inflight back to 0")
    # an unhealthy worker is listed as not eligible, and (down past --forget-after-ms) has lost
    # its sessions and blocks
    sw = next(w for w in ws if w.url == owner)
    sw.config(health_status=503)
    try:
        wait_until(lambda: adm.workers()[owner]["eligible"] is False, 5, what="eligible false")
        t = adm.workers()[owner]
        assert t["sessions"] == 0 and t["index_blocks"] == 0, t
        assert adm.workers()[other]["eligible"] is True
        # /debug/route describes eligible workers only
        ex = adm.explain(chat(text), headers={"x-session-id": "tbl"})
        assert [row["url"] for row in ex["workers"]] == [other], ex
        assert ex["worker"] == other and ex["decision"] == "low_match_min_load", ex
    finally:
        sw.config(health_status=200)
    wait_until(lambda: adm.workers()[owner]["eligible"] is True, 5, what="eligible again")


# ============================================================================ POST /debug/route
def test_debug_route_explains_without_forwarding_or_teaching(stub, kvroute):
    ws, kv, adm = start(stub, kvroute)
    urls = {w.url for w in ws}
    text = "a request explained before anything served it " * 4
    body = chat(text)
    hdr = {"x-session-id": "dbg"}
    for _ in range(5):
        ex = adm.explain(body, headers=hdr)
        assert ex["policy"] == "cache_aware"
        assert ex["decision"] == "low_match_min_load", ex
        assert ex["worker"] in urls
        assert ex["match"] == 0
        assert ex["session_key_bytes"] == 3
        assert ex["routing_text_bytes"] == chat_text_bytes(text), ex
        rows = {row["url"]: row for row in ex["workers"]}
        assert set(rows) == urls
        for row in rows.values():
            assert row["match"] == 0 and row["matched_bytes"] == 0, row
            assert row["inflight"] == 0 and row["overloaded"] is False, row
            assert row["session_owner"] is False, row
    # nothing forwarded, nothing learned
    assert proxied(ws) == 0, "debug/route forwarded a request"
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=MODEL) == 0
    assert m.get("kvroute_index_blocks", model=MODEL) == 0
    assert all(w["sessions"] == 0 and w["index_blocks"] == 0 for w in adm.workers().values())
    # sent for real now: still a first request (neither session_id_match nor prefix_match)
    r = kv.post("/v1/chat/completions", body, headers=hdr)
    assert r.status_code == 200
    assert r.headers["x-kvroute-decision"] == "low_match_min_load", r.headers
    assert r.headers["x-kvroute-match"] == "0.00"
    owner = r.headers["x-kvroute-worker"]
    # explained again: the session and the prefix are known, on the worker that served it
    ex = adm.explain(body, headers=hdr)
    assert ex["decision"] == "session_id_match" and ex["worker"] == owner, ex
    rows = {row["url"]: row for row in ex["workers"]}
    assert rows[owner]["session_owner"] is True
    assert rows[owner]["match"] == pytest.approx(1.0)
    assert rows[owner]["matched_bytes"] == ex["routing_text_bytes"]
    other = next(u for u in urls if u != owner)
    assert rows[other]["session_owner"] is False and rows[other]["matched_bytes"] == 0
    ex = adm.explain(body)  # no session: the prefix
    assert ex["decision"] == "prefix_match" and ex["worker"] == owner and ex["match"] == 1, ex
    assert ex["session_key_bytes"] == 0
    assert proxied(ws) == 1


def test_debug_route_errors_match_the_endpoints(stub, kvroute):
    """A body /debug/route refuses gets the status, param and code the proxied endpoint gives
    the same body, so a client can tell what it would have got."""
    ws, kv, adm = start(stub, kvroute)
    cases = [(None, b'{bad', 400, None, "invalid_json"),
             ({"model": MODEL, "messages": []}, None, 400, "messages", "invalid_value"),
             ({"model": "no-such-route", "messages": [{"role": "user", "content": "x"}]}, None,
              404, "model", "model_not_found")]
    for body, raw, status, param, code in cases:
        real = kv.post("/v1/chat/completions", body, content=raw) if raw is not None else \
            kv.post("/v1/chat/completions", body)
        dbg = adm.post("/debug/route", body, raw=raw)
        assert real.status_code == dbg.status_code == status, (real.text, dbg.text)
        for r in (real, dbg):
            e = r.json()["error"]
            assert (e["param"], e["code"]) == (param, code), (body, raw, r.text)
    r = adm.post("/debug/route?endpoint=embeddings", chat("x"))
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("endpoint", "invalid_value")
    assert all(w.proxied() == [] for w in ws)


def test_debug_route_key_lengths(stub, kvroute):
    ws, kv, adm = start(stub, kvroute)
    comp = lambda p: {"model": MODEL, "prompt": p}  # noqa: E731
    cases = [
        (comp("hello"), 5),                          # a string prompt: its bytes, unframed
        (comp(["hello"]), 5),                        # a one-element batch equals its element
        (comp([1, 2, 3]), len(US + "1 2 3 ")),       # token ids in decimal, never a count
        (comp([[1, 2, 3]]), len(US + "1 2 3 ")),
        (comp([[1, 2], [3]]), len(US + "1 2 " + RS + US + "3 ")),
        (comp(["ab", "cd"]), len("ab" + RS + "cd")),
        (comp([1, 23]), len(US + "1 23 ")),
        (comp(list(range(1000))), len((US + " ".join(map(str, range(1000))) + " ").encode())),
        (comp("caf\u00e9"), 5),                      # UTF-8 bytes of the decoded string
    ]
    for body, want in cases:
        ex = adm.explain(body)
        assert ex["routing_text_bytes"] == want, (body["prompt"] if len(str(body)) < 200 else
                                                   "long", ex["routing_text_bytes"], want)
    ex = adm.explain(comp(""))
    assert ex["routing_text_bytes"] == 0 and ex["decision"] == "empty_key_min_load", ex
    # ?endpoint= chooses the endpoint explicitly
    ex = adm.explain(comp("hello"), endpoint="completions")
    assert ex["routing_text_bytes"] == 5
    # session keys: header as sent, body sources, long ids digested to 32 hex digits
    assert adm.explain(chat("x"), headers={"x-session-id": "abc"})["session_key_bytes"] == 3
    assert adm.explain(chat("x", user="user-77"))["session_key_bytes"] == 7
    assert adm.explain(chat("x", user=42))["session_key_bytes"] == 2
    assert adm.explain(chat("x"), headers={"x-session-id": "s" * 300})["session_key_bytes"] == 32
    assert adm.explain(chat("x"), headers={"x-session-id": "s" * 256})["session_key_bytes"] == 256
    assert adm.explain(chat("x"), headers={"x-request-id": "r1"})["session_key_bytes"] == 0
    assert proxied(ws) == 0


def test_debug_route_escaped_and_raw_json_agree(stub, kvroute):
    ws, kv, adm = start(stub, kvroute)
    text = "Cr\u00e8me br\u00fbl\u00e9e, caf\u00e9 na\u00efve \u2603 \U0001F600 path a/b/c " * 5
    raw = ('{"model":"%s","messages":[{"role":"user","content":"%s"}]}'
           % (MODEL, text)).encode("utf-8")
    esc = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]},
                     ensure_ascii=True).encode().replace(b"a/b/c", b"a\\/b\\/c")
    assert b"\\u00e9" in esc and b"\\/" in esc and b"\\ud83d\\ude00" in esc and raw != esc
    e1 = adm.post("/debug/route", raw=raw).json()
    e2 = adm.post("/debug/route", raw=esc).json()
    assert e1["routing_text_bytes"] == e2["routing_text_bytes"] == chat_text_bytes(text)
    r = kv.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200
    owner = r.headers["x-kvroute-worker"]
    for b in (raw, esc):
        ex = adm.post("/debug/route", raw=b).json()
        assert ex["decision"] == "prefix_match" and ex["worker"] == owner, ex
        assert ex["match"] == pytest.approx(1.0), ex


def test_debug_route_shows_load_and_overload(stub, kvroute):
    ws, kv, adm = start(stub, kvroute, extra=["--balance-abs-threshold", "0",
                                              "--balance-rel-threshold", "1"])
    r = kv.post("/v1/chat/completions", chat("bind me " * 10), headers={"x-session-id": "ov"})
    owner = r.headers["x-kvroute-worker"]
    other = next(w.url for w in ws if w.url != owner)
    conn = RawConn(kv.port, timeout=10)
    conn.send(http_post(kv.port, "/v1/chat/completions", chat("held"),
                        ["x-session-id: ov", "x-stub-mode: json,delay:1500"]))
    try:
        wait_until(lambda: adm.workers()[owner]["inflight"] == 1, 3, what="held request")
        ex = adm.explain(chat("bind me " * 10), headers={"x-session-id": "ov"})
        rows = {row["url"]: row for row in ex["workers"]}
        assert rows[owner]["inflight"] == 1 and rows[owner]["overloaded"] is True, rows
        assert rows[owner]["session_owner"] is True
        assert rows[other]["inflight"] == 0 and rows[other]["overloaded"] is False, rows
        assert ex["decision"] == "load_balance" and ex["worker"] == other, ex
    finally:
        resp = conn.read_response(timeout=10)
        conn.close()
    assert resp.status == 200


def test_debug_route_with_a_hash_policy(stub, kvroute):
    ws, kv, adm = start(stub, kvroute, policy="consistent_hash")
    ex = adm.explain(chat("hello there"), headers={"x-session-id": "ch-1"})
    assert ex["policy"] == "consistent_hash" and ex["decision"] == "consistent_hash", ex
    r = kv.post("/v1/chat/completions", chat("other text"), headers={"x-session-id": "ch-1"})
    assert r.headers["x-kvroute-worker"] == ex["worker"]
    assert adm.get("/workers").json()["policy"] == "consistent_hash"


def test_debug_route_reports_the_previous_response_id_pin(stub, kvroute):
    """POST /debug/route answers "the decision kvroute would make now": a Responses request
    continuing a stored response goes to the worker that produced it, so the explanation must
    name that worker too."""
    ws, kv, adm = start(stub, kvroute)
    first = kv.post("/v1/responses", {"model": MODEL, "input": "start a stored conversation"},
                    headers={"x-session-id": "pin"})
    assert first.status_code == 200
    rid, producer = first.json()["id"], first.headers["x-kvroute-worker"]
    other = next(w.url for w in ws if w.url != producer)
    follow = {"model": MODEL, "previous_response_id": rid, "input": "an unrelated follow-up"}
    conn = RawConn(kv.port, timeout=10)  # make the producer the busier worker
    conn.send(http_post(kv.port, "/v1/responses", {"model": MODEL, "input": "held"},
                        ["x-session-id: pin", "x-stub-mode: json,delay:1500"]))
    try:
        wait_until(lambda: adm.workers()[producer]["inflight"] == 1, 3, what="held request")
        ex = adm.explain(follow, endpoint="responses")
        real = kv.post("/v1/responses", follow)
        assert real.headers["x-kvroute-worker"] == producer, "pin not applied: %r" % real.headers
        assert ex["worker"] == producer, (
            "/debug/route ignores previous_response_id: it says %s (%s), kvroute sends the "
            "request to %s" % (ex["worker"], ex["decision"], producer))
    finally:
        resp = conn.read_response(timeout=10)
        conn.close()
    assert resp.status == 200
    assert other != producer


def test_worker_index_capacity_rules(stub, sim_factory, kvroute):
    # nothing published (stubs): bounded by the global cap
    ws, kv, adm = start(stub, kvroute, extra=["--max-index-blocks", "1000"])
    kv.post("/v1/chat/completions", chat("teach something"))
    assert {w["index_capacity"] for w in adm.workers().values()} == {1000}
    # --worker-index-blocks sets it
    p2 = free_port()
    kvroute(ws, policy="cache_aware", health_interval_ms=0,
            extra=["--admin-port", p2, "--worker-index-blocks", "50"])
    assert {w["index_capacity"] for w in Admin(p2).workers().values()} == {50}
    # never above the global cap
    p3 = free_port()
    kvroute(ws, policy="cache_aware", health_interval_ms=0,
            extra=["--admin-port", p3, "--worker-index-blocks", "5000", "--max-index-blocks", "100"])
    assert all(w["index_capacity"] <= 100 for w in Admin(p3).workers().values())
    # a worker publishing its KV capacity: the flag, when given, still wins
    sims = [sim_factory("--time-scale", "0", "--kv-blocks", "64")]
    p4 = free_port()
    kv4 = kvroute(sims, model="sim-model", policy="cache_aware", health_interval_ms=0,
                  extra=["--admin-port", p4, "--worker-index-blocks", "50",
                         "--scrape-interval", "1"])
    a4 = Admin(p4)
    wait_until(lambda: list(a4.workers().values())[0]["kv_tokens"] == 1024, 4,
               what="the sim's KV capacity scraped")
    kv4.post("/v1/completions", {"model": "sim-model", "prompt": "teach", "max_tokens": 1})
    assert list(a4.workers().values())[0]["index_capacity"] == 50
