"""The cache_aware policy (DESIGN.md §5-§7, §10) and the hash policies, end to end against real
kvroute-sim workers (stub workers only where the sim lacks a feature: /v1/responses and
per-request failures).

What is checked: exact session affinity (session-1 ≠ session-12), conversation-prefix routing
without ids, the overload gate (load_balance), empty keys, random ties, token-id prompts,
escaped/raw JSON, previous_response_id pinning, teaching only on 2xx (at the headers), workers
that leave losing their sessions and index entries, the index/session/scrape metrics, the
index caps, consistent_hash and rendezvous_hash. Every wait is bounded.
"""
import collections
import concurrent.futures
import http.client
import json
import re
import signal
import socket
import threading
import time

import httpx
import pytest

from conftest import MODEL, SIM_MODEL, SSL_CTX, RawConn, free_port, http_post, wait_until

CA_LABELS = {"session_id_match", "prefix_match", "low_match_min_load", "empty_key_min_load",
             "load_balance"}
MATCH_RE = re.compile(r"^(0\.\d\d|1\.00)$")


# ============================================================================ helpers
class Routed:
    """One answered request: where it went and why."""

    def __init__(self, r):
        self.r = r
        self.status = r.status_code
        self.worker = r.headers.get("x-kvroute-worker")
        self.decision = r.headers.get("x-kvroute-decision")
        self.match_hdr = r.headers.get("x-kvroute-match")
        self.match = float(self.match_hdr) if self.match_hdr is not None else None

    def json(self):
        return self.r.json()

    @property
    def text(self):
        return self.r.text

    def __repr__(self):
        return "<%s %s %s match=%s>" % (self.status, self.worker, self.decision, self.match_hdr)


class Resp:
    """The parts of an HTTP response the tests read (httpx.Response-like)."""

    def __init__(self, status, headers, body):
        self.status_code = status
        self.headers = headers  # http.client.HTTPMessage: case-insensitive get()
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


class Client:
    """A keep-alive client for one kvroute: one connection per thread, TCP_NODELAY, request
    line + headers + body in one write. (httpx 0.23 writes headers and body separately without
    TCP_NODELAY, so every keep-alive request waits ~40 ms for a delayed ACK.)"""

    def __init__(self, kv, model=SIM_MODEL, timeout=15.0):
        self.kv = kv
        self.model = model
        self.timeout = timeout
        self.local = threading.local()
        self.conns = []
        self.lock = threading.Lock()

    def _conn(self):
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", self.kv.port, timeout=self.timeout)
            c.connect()
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.conn = c
            with self.lock:
                self.conns.append(c)
        return c

    def close(self):
        with self.lock:
            for c in self.conns:
                c.close()
            self.conns.clear()

    def request(self, method, path, content=b"", headers=None):
        h = {"Content-Type": "application/json", "Content-Length": str(len(content))}
        h.update(headers or {})
        for attempt in range(2):  # a keep-alive connection the server closed: reconnect once
            c = self._conn()
            try:
                c.request(method, path, body=content, headers=h)
                r = c.getresponse()
                body = r.read()
                if r.will_close:
                    c.close()
                    self.local.conn = None
                return Resp(r.status, r.headers, body)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                c.close()
                self.local.conn = None
                if attempt:
                    raise

    def post(self, path, body, headers=None, raw=None, expect=200):
        content = raw if raw is not None else json.dumps(body).encode()
        r = self.request("POST", path, content, headers)
        if expect is not None:
            assert r.status_code == expect, "POST %s → %d %r" % (path, r.status_code, r.text[:300])
        return Routed(r)

    def chat(self, messages, session=None, headers=None, max_tokens=1, expect=200, **extra):
        h = dict(headers or {})
        if session is not None:
            h["x-session-id"] = session
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        body.update(extra)
        return self.post("/v1/chat/completions", body, headers=h, expect=expect)

    def ask(self, text, session=None, **kw):
        return self.chat([{"role": "user", "content": text}], session=session, **kw)

    def complete(self, prompt, max_tokens=1, headers=None, expect=200, **extra):
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
        body.update(extra)
        return self.post("/v1/completions", body, headers=headers, expect=expect)


@pytest.fixture
def clients():
    made = []

    def make(kv, **kw):
        c = Client(kv, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def unique_text(i, tag="q"):
    """A user text that shares no routing-text block with any other i/tag (it differs from
    its first bytes)."""
    return "%s%06d: tell me something new about topic %d, please, in a few words." % (tag, i, i)


def system_prompt(tag, n=12):
    return ("[%s] You are a meticulous assistant for the %s team. Answer precisely, cite the "
            "relevant policy section, and never invent facts. " % (tag, tag)) * n


TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Look an order up by its id.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "cancel_order", "description": "Cancel an order that has not shipped yet.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                         "reason": {"type": "string"}},
                       "required": ["order_id"]}}},
]


def reordered_tools():
    """The same tools in another order with their parameters' keys in another order."""
    out = []
    for t in reversed(TOOLS):
        f = t["function"]
        params = dict(reversed(list(f["parameters"].items())))
        out.append({"type": "function", "function": {
            "parameters": params, "description": f["description"], "name": f["name"]}})
    return out


def inflight(kv):
    return {lb.get("worker"): v for lb, v in kv.metrics().find("kvroute_worker_inflight")}


def sims_kv(sim_factory, kvroute, n, sim_args=("--time-scale", "0"), policy="cache_aware",
            extra=(), health_interval_ms=0):
    sims = [sim_factory(*sim_args) for _ in range(n)]
    kv = kvroute(sims, model=SIM_MODEL, policy=policy, health_interval_ms=health_interval_ms,
                 extra=list(extra))
    return sims, kv


def metric(kv, name, **labels):
    return kv.metrics().get(name, **labels)


# ============================================================================ default, labels, match header
def test_cache_aware_is_the_default_policy_and_match_header(sim_factory, kvroute, clients):
    sims = [sim_factory("--time-scale", "0") for _ in range(2)]
    kv = kvroute(sims, model=SIM_MODEL, policy=None, health_interval_ms=0)  # no --policy
    c = clients(kv)
    text = unique_text(1) + " " + "with a long enough body to fill several blocks. " * 6
    first = c.ask(text)
    assert first.decision == "low_match_min_load", first
    assert first.match_hdr == "0.00", first
    again = c.ask(text)
    assert again.decision == "prefix_match", again
    assert again.worker == first.worker
    assert again.match_hdr == "1.00", "an exact repeat must match 1.00: %r" % again
    # a partial overlap: two decimals, strictly between 0 and 1
    longer = c.chat([{"role": "user", "content": text}, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": "and more " * 20}])
    assert MATCH_RE.match(longer.match_hdr or ""), longer
    assert 0 < longer.match < 1, longer
    m = kv.metrics()
    total = m.get("kvroute_decisions_total", model=SIM_MODEL)
    assert m.get("kvroute_decisions_total", model=SIM_MODEL, policy="cache_aware") == total == 3, \
        m.find("kvroute_decisions_total")
    for lb, _ in m.find("kvroute_decisions_total", model=SIM_MODEL):
        assert lb["decision"] in CA_LABELS, lb
    assert m.get("kvroute_decisions_total", policy="cache_aware", decision="prefix_match") >= 1
    # kvroute_prefix_match_ratio: one observation per request with routing text
    assert m.types.get("kvroute_prefix_match_ratio") == "histogram"
    assert m.get("kvroute_prefix_match_ratio_count", model=SIM_MODEL) == 3
    assert m.get("kvroute_prefix_match_ratio_sum", model=SIM_MODEL) == pytest.approx(
        0 + 1 + longer.match, abs=0.01)
    assert m.get("kvroute_prefix_match_ratio_bucket", model=SIM_MODEL, le="0") == 1
    assert m.get("kvroute_prefix_match_ratio_bucket", model=SIM_MODEL, le="+Inf") == 3


# ============================================================================ sessions
def test_session_ids_are_exact_and_turns_stay_on_their_worker(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4, sim_args=("--time-scale", "0.01"))
    c = clients(kv)
    s1 = c.ask(unique_text(1, "a"), session="session-1")
    assert s1.decision == "low_match_min_load", "first request of a new session: %r" % s1
    s12 = c.ask(unique_text(2, "b"), session="session-12")
    assert s12.decision != "session_id_match", \
        "session-12 was taken for session-1 (prefix comparison of ids): %r" % s12
    assert s12.decision == "low_match_min_load", s12
    s123 = c.ask(unique_text(3, "c"), session="session-123")
    assert s123.decision == "low_match_min_load", s123
    owner = {"session-1": s1.worker, "session-12": s12.worker, "session-123": s123.worker}
    # later turns: unrelated texts (no prefix can explain the choice), every one sticks
    for turn in range(4):
        for k, sid in enumerate(owner):
            r = c.ask(unique_text(100 + 10 * turn + k, "t"), session=sid)
            assert r.decision == "session_id_match", (sid, turn, r)
            assert r.worker == owner[sid], "session %s moved: %r" % (sid, r)
    # other session sources (DESIGN §5): header x-conversation-id, body session_id and user
    src = [({"x-conversation-id": "conv-9"}, {}), ({}, {"session_id": "body-9"}),
           ({}, {"user": "user-9"}), ({}, {"session_params": {"session_id": "sp-9"}}),
           # agent clients' ids: Claude Code's header, OpenAI's prompt_cache_key, gateways'
           ({"x-claude-code-session-id": "cc-9"}, {}), ({}, {"prompt_cache_key": "pck-9"}),
           ({"x-session-affinity": "aff-9"}, {}), ({"session_id": "hdr-9"}, {})]
    for i, (h, b) in enumerate(src):
        a = c.ask(unique_text(200 + i, "s"), headers=h, **b)
        assert a.decision == "low_match_min_load", (h, b, a)
        for j in range(2):
            r = c.ask(unique_text(300 + 10 * i + j, "u"), headers=h, **b)
            assert r.decision == "session_id_match" and r.worker == a.worker, (h, b, r)
    # per-request ids are never session keys
    a = c.ask(unique_text(400, "r"), headers={"x-request-id": "same-req-id"})
    b = c.ask(unique_text(401, "r"), headers={"x-request-id": "same-req-id"})
    assert b.decision == "low_match_min_load", "x-request-id used as a session key: %r %r" % (a, b)
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 3 + len(src)


def test_session_key_edge_cases(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    # a non-string body value counts by its JSON text: "user": 42 and "user": "42" are one session
    a = c.ask(unique_text(1, "k"), user=42)
    b = c.ask(unique_text(2, "k"), user="42")
    assert b.decision == "session_id_match" and b.worker == a.worker, (a, b)
    # an empty header value means no session: the next source (body session_id) is used
    d = c.ask(unique_text(3, "k"), headers={"x-session-id": ""}, session_id="body-id")
    e = c.ask(unique_text(4, "k"), session_id="body-id")
    assert e.decision == "session_id_match" and e.worker == d.worker, (d, e)
    f = c.ask(unique_text(5, "k"), headers={"x-session-id": ""})
    assert f.decision == "low_match_min_load", f
    # ids over 256 bytes are digested whole, never cut: two that differ only at byte 300 are
    # two sessions, and each is sticky
    long1 = "L" * 299 + "1"
    long2 = "L" * 299 + "2"
    g1 = c.ask(unique_text(6, "k"), session=long1)
    g2 = c.ask(unique_text(7, "k"), session=long2)
    assert g1.status == 200 and g2.decision == "low_match_min_load", \
        "long ids sharing their first 299 bytes were taken for one session: %r" % g2
    for i in range(3):
        assert c.ask(unique_text(10 + i, "k"), session=long1).worker == g1.worker
        assert c.ask(unique_text(20 + i, "k"), session=long2).decision == "session_id_match"
    # header values are used as sent: no percent-decoding, case matters
    h1 = c.ask(unique_text(30, "k"), session="a%20b")
    h2 = c.ask(unique_text(31, "k"), session="a b")
    h3 = c.ask(unique_text(32, "k"), session="A%20B")
    assert h2.decision == "low_match_min_load" and h3.decision == "low_match_min_load", (h1, h2, h3)


def test_first_requests_of_1000_new_sessions_split_evenly(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    counts = collections.Counter()
    decisions = collections.Counter()
    t0 = time.monotonic()
    for i in range(1000):  # sequential: every worker is idle at each pick, so all four tie
        r = c.ask(unique_text(i, "n"), session="new-session-%d" % i)
        counts[r.worker] += 1
        decisions[r.decision] += 1
        assert r.match_hdr == "0.00", r
        assert time.monotonic() - t0 < 40, "1000 requests took too long"
    assert decisions == {"low_match_min_load": 1000}, decisions
    assert set(counts) == {s.url for s in sims}, counts
    for w, n in counts.items():
        assert 200 <= n <= 300, "split not within ±20%% of 250 (ties not random?): %r" % counts
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 1000
    assert m.get("kvroute_decisions_total", policy="cache_aware",
                 decision="low_match_min_load") == 1000


# ============================================================================ prefixes
def test_shared_system_prompt_and_tools_land_on_the_same_worker(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    for k in range(3):
        system = {"role": "system", "content": system_prompt("team%d" % k)}
        first = c.chat([system, {"role": "user", "content": "Where is order 1%d?" % k}],
                       tools=TOOLS)
        assert first.decision == "low_match_min_load", first
        # a new conversation, no session id, same system prompt and tools (listed in another
        # order, parameters' keys in another order): the tools are sorted, JSON canonical
        nxt = c.chat([system, {"role": "user", "content": "Cancel order 2%d." % k}],
                     tools=reordered_tools())
        assert nxt.decision == "prefix_match", nxt
        assert nxt.worker == first.worker, (first, nxt)
        assert 0.5 <= nxt.match < 1, nxt


def test_next_turn_follows_its_history_without_an_id(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 4, sim_args=("--time-scale", "0.01"))
    c = clients(kv)
    msgs = [{"role": "system", "content": system_prompt("chat")},
            {"role": "user", "content": "Explain how prefix caching works in two lines."}]
    first = c.chat(msgs, max_tokens=12)
    assert first.decision == "low_match_min_load"
    cached = []
    r = first
    for turn in range(4):
        answer = r.json()["choices"][0]["message"]["content"]
        msgs = msgs + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": "And what about turn %d?" % (turn + 2)}]
        r = c.chat(msgs, max_tokens=12)
        assert r.decision == "prefix_match", (turn, r)
        assert r.worker == first.worker, (turn, r)
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    # the sim confirms the routing paid off: every later turn hit its worker's prefix cache
    assert all(x > 0 for x in cached), cached


# Message texts are kept by default (--routing-text-cache-bytes) and found again by every
# later turn; without them each turn decodes all its messages. The decisions must not differ.
@pytest.mark.parametrize("text_cache", ["default", "0"])
def test_agent_turns_with_tool_calls_follow_their_history(sim_factory, kvroute, clients,
                                                          text_cache):
    extra = () if text_cache == "default" else ("--routing-text-cache-bytes", text_cache)
    _, kv = sims_kv(sim_factory, kvroute, 4, extra=extra)
    c = clients(kv)
    msgs = [{"role": "system", "content": system_prompt("agent", 4)},
            {"role": "user", "content": "Where is order 77? Cancel it if it has not shipped."}]
    first = c.chat(msgs, tools=TOOLS)
    owner = first.worker
    for k, (name, args, result) in enumerate((
            ("lookup_order", '{"order_id": "77"}', '{"status": "processing"}'),
            ("cancel_order", '{"order_id": "77", "reason": "asked"}', '{"ok": true}'))):
        # clients re-send tool-call turns with content null (or absent) and call ids
        msgs = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_%d" % k, "type": "function",
                 "function": {"name": name, "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_%d" % k, "content": result}]
        r = c.chat(msgs, tools=reordered_tools())
        assert r.decision == "prefix_match" and r.worker == owner, (k, r)
    # the same history with the assistant content spelled "" instead of null: same text
    alt = [dict(m, content="") if m["role"] == "assistant" else m for m in msgs]
    r = c.chat(alt, tools=TOOLS)
    assert r.decision == "prefix_match" and r.worker == owner and r.match_hdr == "1.00", r
    # every turn resent the system prompt: its text was built once, then reused
    hits = metric(kv, "kvroute_routing_text_cache_hits_total")
    misses = metric(kv, "kvroute_routing_text_cache_misses_total")
    kept = metric(kv, "kvroute_routing_text_cache_bytes")
    if text_cache == "0":
        assert (hits, misses, kept) == (0, 0, 0)
    else:
        assert hits >= 3 and misses >= 1 and 0 < kept <= 64 << 20, (hits, misses, kept)


# A route that reads no routing text (round_robin) keeps the messages it accepted, without
# their texts, so a later turn's scan takes the resent ones by hash instead of validating
# them again; anything else in the body is still validated: a broken new message is a 400.
def test_round_robin_keeps_accepted_messages_and_still_refuses_bad_bytes(sim_factory,
                                                                         kvroute):
    _, kv = sims_kv(sim_factory, kvroute, 2, policy="round_robin")
    msgs = [{"role": "system", "content": system_prompt("rr", 3)},
            {"role": "user", "content": unique_text(1, "rr")}]
    assert metric(kv, "kvroute_routing_text_cache_bytes") == 0
    for turn in range(3):
        r = kv.post("/v1/chat/completions", {"model": SIM_MODEL, "messages": msgs,
                                             "max_tokens": 4})
        assert r.status_code == 200, r.text
        msgs = msgs + [{"role": "assistant", "content": "reply %d, long enough to be kept by "
                        "the router's message memo" % turn},
                       {"role": "user", "content": unique_text(turn + 2, "rr")}]
    kept = metric(kv, "kvroute_routing_text_cache_bytes")
    assert 0 < kept < 64 << 10, kept
    # no routing text was built or taken: the counters are the text-reading routes'
    assert metric(kv, "kvroute_routing_text_cache_hits_total") == 0
    assert metric(kv, "kvroute_routing_text_cache_misses_total") == 0
    good = json.dumps({"model": SIM_MODEL, "messages": msgs, "max_tokens": 4}).encode()
    # the kept messages resent, then a new one holding a raw control byte: refused
    tail = b',{"role":"user","content":"a raw \x01 control byte, long enough to be offered"}]'
    i = good.rindex(b"]")
    bad = good[:i] + tail + good[i + 1:]
    r = kv.post("/v1/chat/completions", content=bad)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    # a kept message with one byte changed inside its string: it is no longer known, and
    # its invalid escape is found
    j = good.index(b"reply 0")
    bad = good[:j] + b"\\q" + good[j + 2:]
    r = kv.post("/v1/chat/completions", content=bad)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    r = kv.post("/v1/chat/completions", content=good)
    assert r.status_code == 200, r.text


def test_completions_token_ids_route_by_prefix_never_by_count(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    base = [(i * 7919) % 120000 + 10 for i in range(300)]
    a = c.complete(base + [11, 12])
    assert a.decision == "low_match_min_load", a
    b = c.complete(base + [99, 98, 97])  # a long shared id prefix, another tail
    assert b.decision == "prefix_match" and b.worker == a.worker, (a, b)
    assert 0.9 <= b.match < 1, b
    # a one-element batch equals its element
    one = c.complete([base + [11, 12]])
    assert one.decision == "prefix_match" and one.worker == a.worker and one.match_hdr == "1.00", one
    # same length, other ids: nothing in common (never collapsed to a count)
    other = [(i * 104729) % 120000 + 10 for i in range(302)]
    o = c.complete(other)
    assert o.decision == "low_match_min_load" and o.match_hdr == "0.00", o
    # [1,2] is not a prefix of [1,23]
    c.complete([5, 6, 7, 8, 1, 2])
    d = c.complete([5, 6, 7, 8, 1, 23])
    assert d.match < 1, d
    # string prompts and a one-element list of a string
    s = c.complete("In the beginning the universe was created. " * 8)
    t = c.complete(["In the beginning the universe was created. " * 8])
    assert t.decision == "prefix_match" and t.worker == s.worker and t.match_hdr == "1.00", (s, t)


def test_escaped_and_raw_session_ids_in_the_body_are_one_session(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    raw = ('{"model":"%s","max_tokens":1,"session_id":"séance/1",'
           '"messages":[{"role":"user","content":"%s"}]}') % (SIM_MODEL, unique_text(1, "sid"))
    esc = ('{"model":"%s","max_tokens":1,"session_id":"s\\u00e9ance\\/1",'
           '"messages":[{"role":"user","content":"%s"}]}') % (SIM_MODEL, unique_text(2, "sid"))
    assert "\\u00e9" in esc
    a = c.post("/v1/chat/completions", None, raw=raw.encode("utf-8"))
    b = c.post("/v1/chat/completions", None, raw=esc.encode())
    assert b.decision == "session_id_match" and b.worker == a.worker, (a, b)


def test_escaped_and_raw_json_text_route_identically(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    text = "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u2014 na\u00efve r\u00e9sum\u00e9 a/b/c " * 6
    raw = ('{"model":"%s","max_tokens":1,"messages":[{"role":"user","content":"%s"}]}'
           % (SIM_MODEL, text)).encode("utf-8")
    escaped = json.dumps({"model": SIM_MODEL, "max_tokens": 1,
                          "messages": [{"role": "user", "content": text.replace("/", "\\/")}]},
                         ensure_ascii=True).encode()
    # make the escaped body really spell "\/" (json.dumps escaped our backslash)
    escaped = escaped.replace(b"\\\\/", b"\\/")
    assert b"\\u00e9" in escaped and b"\\/" in escaped and "é".encode() in raw
    a = c.post("/v1/chat/completions", None, raw=raw)
    assert a.decision == "low_match_min_load", a
    b = c.post("/v1/chat/completions", None, raw=escaped)
    assert b.decision == "prefix_match" and b.worker == a.worker and b.match_hdr == "1.00", (a, b)


def test_equivalent_chat_spellings_share_keys(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    text = "A question asked with a string content field, long enough to span blocks. " * 3
    a = c.chat([{"role": "user", "content": text}])
    # one text part serializes like the string
    b = c.chat([{"role": "user", "content": [{"type": "text", "text": text}]}])
    assert b.decision == "prefix_match" and b.worker == a.worker and b.match_hdr == "1.00", (a, b)
    # non-text parts count by a digest of their content: the same image matches, another not
    img = lambda u: [{"role": "user", "content": [  # noqa: E731
        {"type": "text", "text": "Describe this picture in detail, please. " * 3},
        {"type": "image_url", "image_url": {"url": u}}]}]
    p1 = c.chat(img("https://example.invalid/cat.png"))
    p2 = c.chat(img("https://example.invalid/cat.png"))
    assert p2.decision == "prefix_match" and p2.worker == p1.worker and p2.match_hdr == "1.00"
    p3 = c.chat(img("https://example.invalid/dog.png"))
    assert p3.match is not None and p3.match < 1, p3


def test_prefix_ties_are_random_among_holders(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 3)
    c = clients(kv)
    text = "a prompt that two workers both served " * 5
    # serve the same text on two workers (each through a session bound to that worker)
    holders = set()
    i = 0
    while len(holders) < 2 and i < 60:
        r = c.ask(unique_text(i, "tie"), session="tie-%d" % i)
        if r.worker not in holders:
            holders.add(r.worker)
            t = c.ask(text, session="tie-%d" % i)
            assert t.worker == r.worker and t.decision == "session_id_match"
        i += 1
    assert len(holders) == 2
    seen = collections.Counter()
    for _ in range(40):
        r = c.ask(text)
        assert r.decision == "prefix_match" and r.match_hdr == "1.00", r
        seen[r.worker] += 1
    assert set(seen) == holders, "ties among equal matches are not random: %r" % seen


# ============================================================================ load gates
def gate_model(n_workers, n_requests, abs_t=32, rel_t=1.5):
    """How many of n_requests concurrent requests of one session the owner (worker 0, idle)
    takes under the overload gate when all stay in flight."""
    loads = [0] * n_workers
    for _ in range(n_requests):
        mn = min(loads)
        over = loads[0] - mn > abs_t and loads[0] > mn * rel_t
        if over:
            j = min(range(1, n_workers), key=lambda i: loads[i])
            loads[j] += 1
        else:
            loads[0] += 1
    return loads[0]


def test_overloaded_affinity_worker_sheds_to_least_loaded(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 4, sim_args=("--time-scale", "0.01"))
    c = clients(kv)
    bind = c.ask(unique_text(0, "g"), session="hot")
    owner = bind.worker
    assert c.ask(unique_text(1, "g"), session="hot").worker == owner
    for s in sims:  # every request is held ~2.5 s before its headers: all 60 overlap
        s.faults(delay_ms=2500)
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                samples.append(inflight(kv))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.03)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(60) as ex:
            futs = [ex.submit(c.ask, unique_text(1000 + i, "h"), "hot") for i in range(60)]
            results = [f.result(timeout=30) for f in futs]
    finally:
        stop.set()
        th.join(5)
        for s in sims:
            s.faults(delay_ms=0)
    by = collections.Counter((r.worker, r.decision) for r in results)
    to_owner = sum(v for (w, _), v in by.items() if w == owner)
    lb = [r for r in results if r.decision == "load_balance"]
    assert all(r.decision in ("session_id_match", "load_balance") for r in results), by
    assert all(r.worker == owner for r in results if r.decision == "session_id_match"), by
    assert all(r.worker != owner for r in lb), "load_balance sent to the overloaded owner: %r" % by
    assert lb, "the owner was never refused for load: %r" % by
    # the owner keeps affinity up to the gate, and not beyond it
    assert 33 <= to_owner <= gate_model(4, 60), (to_owner, gate_model(4, 60), by)
    # least loaded: the shed requests are spread evenly over the three others
    shed = collections.Counter(r.worker for r in lb)
    assert len(shed) == 3 and max(shed.values()) - min(shed.values()) <= 1, shed
    # the owner's load never passed the gate (load − min > 32 and load > 1.5 × min)
    worst = 0
    for smp in samples:
        if owner in smp and len(smp) == 4:
            mn = min(smp.values())
            if smp[owner] - mn > 33 and smp[owner] > mn * 1.5 + 1:
                worst = max(worst, smp[owner] - mn)
    assert worst == 0, "owner's in-flight load passed the gate: %r" % samples
    assert any(smp.get(owner, 0) >= 30 for smp in samples), \
        "the burst was not observed in flight (samples %d)" % len(samples)
    m = kv.metrics()
    assert m.get("kvroute_decisions_total", policy="cache_aware", decision="load_balance") == len(lb)


def test_gate_and_threshold_flags(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 2, extra=["--balance-abs-threshold", "2",
                                                       "--balance-rel-threshold", "1.5"])
    c = clients(kv)
    text = "the prefix this worker learned earlier " * 5
    owner = c.ask(text, session="w").worker
    other = next(s.url for s in sims if s.url != owner)
    wb = c.ask(text, session="wb")  # a second session bound to the owner (via its prefix)
    assert wb.decision == "prefix_match" and wb.worker == owner, wb
    sim_of = {s.url: s for s in sims}
    sim_of[owner].faults(delay_ms=2000)
    ex = concurrent.futures.ThreadPoolExecutor(6)
    try:
        held = [ex.submit(c.ask, unique_text(i, "w"), "w") for i in range(3)]
        wait_until(lambda: inflight(kv).get(owner) == 3, 5, what="3 requests held at the owner")
        # 3 − 0 > 2 and 3 > 0 × 1.5: both affinities are refused for load
        r1 = c.ask(unique_text(50, "w"), session="w")
        assert r1.decision == "load_balance" and r1.worker == other, r1
        r2 = c.ask(text)
        assert r2.decision == "load_balance" and r2.worker == other, r2
        # with 2 held on the other worker too: 3 − 2 ≤ 2, the owner is no longer overloaded
        s2 = None
        for i in range(20):
            r = c.ask(unique_text(100 + i, "w2"), session="v-%d" % i)
            if r.worker == other:
                s2 = "v-%d" % i
                break
        assert s2, "no session landed on the other worker"
        sim_of[other].faults(delay_ms=2000)
        held += [ex.submit(c.ask, unique_text(200 + i, "w2"), s2) for i in range(2)]
        wait_until(lambda: inflight(kv).get(other) == 2, 5, what="2 requests held at the other")
        # (session "w" now belongs to the other worker: r1 answered there and taught it)
        r3 = c.ask(unique_text(60, "w"), session="wb")
        assert r3.decision == "session_id_match" and r3.worker == owner, r3
    finally:
        for s in sims:
            s.faults(delay_ms=0)
        [f.result(timeout=15) for f in held]
        ex.shutdown()
    # --cache-threshold: a 0.6-ish match is enough at 0.5, not at 0.9
    kv9 = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=0,
                  extra=["--cache-threshold", "0.9"])
    for k, want in ((kv, "prefix_match"), (kv9, "low_match_min_load")):
        ck = clients(k)
        base = "a shared opening of moderate length for the threshold check " * 5
        ck.ask(base, session="th")
        r = ck.chat([{"role": "user", "content": base},
                     {"role": "user", "content": "a follow-up of comparable size here " * 3}])
        assert 0.5 <= r.match < 0.9, r
        assert r.decision == want, (k.argv[-2:], r)


def test_gate_uses_the_eligible_set_only(sim_factory, kvroute, clients):
    """An unhealthy idle worker must not drag min_load to 0 and make busy workers look
    overloaded (DESIGN §9: gates work on one eligible set)."""
    sims, kv = sims_kv(sim_factory, kvroute, 3, health_interval_ms=100,
                       extra=["--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5"])
    c = clients(kv)
    owners = {}
    for i in range(60):  # one session on each of two workers
        r = c.ask(unique_text(i, "es"), session="es-%d" % i)
        owners.setdefault(r.worker, "es-%d" % i)
        if len(owners) == 3:
            break
    assert len(owners) == 3
    (w, sw), (v, sv), (u, _) = list(owners.items())
    sim_of = {s.url: s for s in sims}
    sim_of[u].faults(health_status=503)
    wait_until(lambda: kv.metrics().get("kvroute_worker_healthy", worker=u) == 0, 5,
               what="the third worker to be unhealthy")
    for x in (w, v):
        sim_of[x].faults(delay_ms=2000)
    ex = concurrent.futures.ThreadPoolExecutor(6)
    held = []
    try:
        held += [ex.submit(c.ask, unique_text(100 + i, "es"), sw) for i in range(3)]
        held += [ex.submit(c.ask, unique_text(200 + i, "es"), sv) for i in range(3)]
        wait_until(lambda: inflight(kv).get(w) == 3 and inflight(kv).get(v) == 3, 5,
                   what="3 requests held at each healthy worker")
        sim_of[w].faults(delay_ms=0)
        r = c.ask(unique_text(300, "es"), session=sw)
        assert r.decision == "session_id_match" and r.worker == w, \
            "the gate counted an ineligible worker's load: %r" % r
    finally:
        for x in sims:
            x.faults(delay_ms=0, health_status=200)
        [f.result(timeout=15) for f in held]
        ex.shutdown()


def test_request_without_text_goes_to_least_loaded_worker(sim_factory, kvroute, clients):
    sims, kv = sims_kv(sim_factory, kvroute, 2)
    c = clients(kv)
    # idle: empty keys spread (random ties), never a match header value above 0
    seen = collections.Counter()
    for _ in range(30):
        r = c.complete("")
        assert r.decision == "empty_key_min_load", r
        assert r.match_hdr in (None, "0.00"), r
        seen[r.worker] += 1
    assert len(seen) == 2, "ties among idle workers are not random: %r" % seen
    # hold three requests on one worker (its session), then ask with an empty key
    owner = c.ask(unique_text(5, "e"), session="busy").worker
    busy = next(s for s in sims if s.url == owner)
    other = next(s for s in sims if s.url != owner)
    busy.faults(delay_ms=2500)
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        futs = [ex.submit(c.ask, unique_text(10 + i, "e"), "busy") for i in range(3)]
        try:
            wait_until(lambda: inflight(kv).get(owner) == 3, 5, what="3 requests held at owner")
            for _ in range(5):
                r = c.complete("")
                assert r.decision == "empty_key_min_load" and r.worker == other.url, r
        finally:
            busy.faults(delay_ms=0)
            held = [f.result(timeout=15) for f in futs]
    assert all(h.decision == "session_id_match" and h.worker == owner for h in held), held


# ============================================================================ responses (stub workers)
def test_previous_response_id_pins_to_the_worker_that_produced_it(stub, kvroute, clients):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="cache_aware", health_interval_ms=0)
    c = clients(kv, model=MODEL)
    for k, stream in enumerate((False, True)):
        body = {"model": MODEL, "input": "start conversation %d " % k + "x" * 50}
        if stream:
            body["stream"] = True
        first = c.post("/v1/responses", body, headers={"x-session-id": "pin-holder-%d" % k})
        if stream:
            ids = re.findall(r'"id": "(resp_[^"]+)"', first.r.text)
            assert ids, first.r.text[:300]
            rid = ids[0]
        else:
            rid = first.json()["id"]
        producer = first.worker
        # make the producer the more loaded worker: one held request bound to it
        conn = RawConn(kv.port, timeout=10)
        conn.send(http_post(kv.port, "/v1/responses", {"model": MODEL, "input": "hold %d" % k},
                            ["x-session-id: pin-holder-%d" % k, "x-stub-mode: json,delay:800"]))
        try:
            wait_until(lambda: inflight(kv).get(producer) == 1, 3, what="the held request")
            cont = c.post("/v1/responses", {"model": MODEL, "previous_response_id": rid,
                                            "input": "zz unrelated follow-up %d" % k})
            assert cont.worker == producer, \
                "previous_response_id %s did not pin to its producer %s: %r" % (rid, producer, cont)
            # control: the same follow-up without the id goes to the idle worker
            ctl = c.post("/v1/responses", {"model": MODEL, "input": "zz unrelated other %d" % k})
            assert ctl.worker != producer, ctl
        finally:
            resp = conn.read_response(timeout=10)
            conn.close()
        assert resp is not None and resp.status == 200, resp
    # the continuation's own answer pins its follow-up in turn
    body = {"model": MODEL, "input": "chain start"}
    r1 = c.post("/v1/responses", body)
    r2 = c.post("/v1/responses", {"model": MODEL, "input": "q2", "previous_response_id": r1.json()["id"]})
    r3 = c.post("/v1/responses", {"model": MODEL, "input": "q3", "previous_response_id": r2.json()["id"]})
    assert r1.worker == r2.worker == r3.worker, (r1, r2, r3)


def test_responses_routing_text_instructions_tools_and_items(stub, kvroute, clients):
    ws = [stub(), stub(), stub()]
    kv = kvroute(ws, policy="cache_aware", health_interval_ms=0)
    c = clients(kv, model=MODEL)
    instr = "You are the billing agent. Follow the refund policy exactly. " * 10
    tools = [{"type": "function", "name": "refund", "description": "Refund an order",
              "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}]
    a = c.post("/v1/responses", {"model": MODEL, "instructions": instr, "tools": tools,
                                 "input": [{"role": "user", "content": "refund order 1"}]})
    assert a.decision == "low_match_min_load", a
    b = c.post("/v1/responses", {"model": MODEL, "instructions": instr, "tools": tools,
                                 "input": [{"role": "user", "content": "refund order 2"}]})
    assert b.decision == "prefix_match" and b.worker == a.worker, (a, b)
    # other instructions: no match
    d = c.post("/v1/responses", {"model": MODEL, "instructions": "Other agent. " * 40,
                                 "tools": tools, "input": "refund order 1"})
    assert d.decision == "low_match_min_load", d


# ============================================================================ teaching
def test_failed_attempts_teach_nothing(stub, kvroute, clients):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="cache_aware", health_interval_ms=0)
    c = clients(kv, model=MODEL)
    msgs = [{"role": "user", "content": "a request that first fails " * 8}]
    for status in (500, 503, 429, 400):
        f = c.chat(msgs, session="fails", headers={"x-stub-mode": "fail:%d" % status},
                   expect=status)
        assert f.decision == "low_match_min_load", f
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=MODEL) == 0
    assert m.get("kvroute_index_blocks", model=MODEL) == 0
    ok = c.chat(msgs, session="fails")
    assert ok.decision == "low_match_min_load" and ok.match_hdr == "0.00", \
        "learned from a failed attempt: %r" % ok
    again = c.chat(msgs, session="fails")
    assert again.decision == "session_id_match" and again.worker == ok.worker, again
    again2 = c.chat(msgs)
    assert again2.decision == "prefix_match" and again2.worker == ok.worker, again2


def test_attempt_aborted_before_headers_teaches_nothing(stub, kvroute, clients):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="cache_aware", health_interval_ms=0)
    c = clients(kv, model=MODEL)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "abandoned early " * 10}]}
    conn = RawConn(kv.port, timeout=10)
    conn.send(http_post(kv.port, "/v1/chat/completions", body,
                        ["x-session-id: gone", "x-stub-mode: json,delay:800"]))
    wait_until(lambda: sum(inflight(kv).values()) == 1, 3, what="the request in flight")
    conn.close()  # the client leaves before the worker's headers
    kv.wait_inflight_zero(timeout=3)
    time.sleep(1.0)  # past the worker's delay: a late answer must not teach either
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=MODEL) == 0
    assert m.get("kvroute_index_blocks", model=MODEL) == 0
    r = c.chat(body["messages"], session="gone")
    assert r.decision == "low_match_min_load" and r.match_hdr == "0.00", r


def test_teaching_happens_at_the_2xx_headers(stub, kvroute, clients):
    ws = [stub(), stub()]
    kv = kvroute(ws, policy="cache_aware", health_interval_ms=0)
    c = clients(kv, model=MODEL)
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": "a long streamed answer " * 8}]}
    conn = RawConn(kv.port, timeout=10)
    conn.send(http_post(kv.port, "/v1/chat/completions", body, ["x-stub-mode: sse,stall_after:1"]))
    try:
        head = conn.read_head(timeout=5)
        assert head is not None and head[0] == 200, head
        first_worker = dict(head[3]).get("x-kvroute-worker")
        # the first answer has started but not ended: its prefix is already known
        r = c.chat(body["messages"], stream=False)
        assert r.decision == "prefix_match" and r.worker == first_worker, r
    finally:
        conn.close()


# ============================================================================ workers leaving
def test_unhealthy_worker_loses_its_sessions_and_index_entries(sim_factory, kvroute, clients):
    """Down longer than --forget-after-ms (0 here), a worker loses what was learned about it."""
    sims, kv = sims_kv(sim_factory, kvroute, 2, health_interval_ms=100,
                       extra=["--forget-after-ms", "0"])
    c = clients(kv)
    text = "a conversation learned before its worker failed " * 6
    a = c.ask(text, session="leaver")
    owner = a.worker
    bs = next(s for s in sims if s.url == owner)
    assert c.ask(text, session="leaver").decision == "session_id_match"
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 1
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) > 0
    bs.faults(health_status=503)
    wait_until(lambda: kv.metrics().get("kvroute_worker_healthy", worker=owner) == 0, 5,
               what="the worker to be marked unhealthy")
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 0, "sessions kept for a failed worker"
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) == 0, "index kept for a failed worker"
    assert m.get("kvroute_session_evictions_total", model=SIM_MODEL, reason="worker_removed") == 1
    bs.faults(health_status=200)
    wait_until(lambda: kv.metrics().get("kvroute_worker_healthy", worker=owner) == 1, 5,
               what="the worker to be healthy again")
    back = c.ask(text, session="leaver")
    assert back.decision == "low_match_min_load" and back.match_hdr == "0.00", \
        "session or prefix survived its worker leaving: %r" % back
    # and while a worker is down its session goes elsewhere (not session_id_match)
    owner2 = back.worker
    bs2 = next(s for s in sims if s.url == owner2)
    bs2.faults(health_status=503)
    wait_until(lambda: kv.metrics().get("kvroute_worker_healthy", worker=owner2) == 0, 5,
               what="the second worker to be marked unhealthy")
    moved = c.ask(text, session="leaver")
    assert moved.worker != owner2 and moved.decision == "low_match_min_load", moved
    bs2.faults(health_status=200)


# ============================================================================ metrics and caps
def test_session_and_index_metrics_move(sim_factory, kvroute, clients):
    # prompts only: the counts below are those of the request texts (no completion teaching)
    _, kv = sims_kv(sim_factory, kvroute, 2, extra=["--max-sessions", "5", "--session-ttl", "1",
                                                    "--teach-completion-max-bytes", "0"])
    c = clients(kv)
    m = kv.metrics()
    for name in ("kvroute_index_blocks", "kvroute_sessions"):
        assert m.types.get(name) == "gauge", (name, m.types.get(name))
    for name in ("kvroute_index_evictions_total", "kvroute_session_evictions_total"):
        assert m.types.get(name) == "counter", (name, m.types.get(name))
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) == 0
    text = "x" * 64 * 3 + "tail"  # routing text = framing + 196 bytes → 4 blocks
    c.ask(text)
    blocks1 = metric(kv, "kvroute_index_blocks", model=SIM_MODEL)
    assert blocks1 == 4, blocks1
    c.ask(text)  # a repeat adds nothing
    assert metric(kv, "kvroute_index_blocks", model=SIM_MODEL) == blocks1
    for i in range(8):
        c.ask(unique_text(i, "m"), session="m-%d" % i)
    m = kv.metrics()
    assert m.get("kvroute_sessions", model=SIM_MODEL) == 5
    assert m.get("kvroute_session_evictions_total", model=SIM_MODEL, reason="capacity") == 3
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) > blocks1
    # the most recent session is still there; the oldest was evicted
    assert c.ask(unique_text(900, "m"), session="m-7").decision == "session_id_match"
    assert c.ask(unique_text(901, "m"), session="m-0").decision != "session_id_match"
    # TTL 1 s: an idle session expires
    c.ask(unique_text(902, "m"), session="ttl-s")
    time.sleep(1.3)
    r = c.ask(unique_text(903, "m"), session="ttl-s")
    assert r.decision != "session_id_match", "session outlived --session-ttl 1: %r" % r
    assert metric(kv, "kvroute_session_evictions_total", model=SIM_MODEL, reason="ttl") >= 1


def test_session_ttl_is_idle_time_and_capacity_evicts_least_recently_used(
        sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4, extra=["--max-sessions", "3", "--session-ttl", "1"])
    c = clients(kv)
    # used every 0.4 s for 2 s: a 1 s TTL counts idle time, so it never expires
    c.ask(unique_text(0, "ttl"), session="busy")
    for i in range(5):
        time.sleep(0.4)
        r = c.ask(unique_text(1 + i, "ttl"), session="busy")
        assert r.decision == "session_id_match", "active session expired (TTL from creation?)"
    # capacity 3: a, b, c bound; a used again; d evicts b (the least recently used), not a
    for sid in ("a", "b", "c"):
        c.ask(unique_text(10, sid), session=sid)
    assert c.ask(unique_text(11, "a"), session="a").decision == "session_id_match"
    c.ask(unique_text(10, "d"), session="d")
    assert c.ask(unique_text(12, "a"), session="a").decision == "session_id_match"
    assert c.ask(unique_text(12, "b"), session="b").decision != "session_id_match", \
        "capacity eviction did not take the least recently used session"
    assert metric(kv, "kvroute_sessions", model=SIM_MODEL) == 3
    # idle sessions are swept without traffic: the gauge falls to 0
    ttl0 = metric(kv, "kvroute_session_evictions_total", model=SIM_MODEL, reason="ttl")
    wait_until(lambda: metric(kv, "kvroute_sessions", model=SIM_MODEL) == 0, 4, interval=0.2,
               what="expired sessions swept while idle")
    assert metric(kv, "kvroute_session_evictions_total", model=SIM_MODEL, reason="ttl") == ttl0 + 3


def test_session_keys_flag(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 4,
                    extra=["--session-keys", "header:X-Tenant-Session, body:metadata.sid"])
    c = clients(kv)
    a = c.ask(unique_text(1, "sk"), headers={"x-tenant-session": "t1"})
    b = c.ask(unique_text(2, "sk"), headers={"x-tenant-session": "t1"})
    assert b.decision == "session_id_match" and b.worker == a.worker, b
    d = c.ask(unique_text(3, "sk"), metadata={"sid": "m1"})
    e = c.ask(unique_text(4, "sk"), metadata={"sid": "m1"})
    assert e.decision == "session_id_match" and e.worker == d.worker, e
    # x-session-id is no longer a source
    c.ask(unique_text(5, "sk"), session="plain")
    f = c.ask(unique_text(6, "sk"), session="plain")
    assert f.decision == "low_match_min_load", f
    # per-request ids are refused as sources
    bad = kvroute([kv.workers[0]], model=SIM_MODEL, policy="cache_aware", health_interval_ms=0,
                  wait_ready=False, check_inflight=False,
                  extra=["--session-keys", "header:x-request-id"])
    rc = bad.proc.wait(5)
    assert rc is not None and rc != 0, "kvroute accepted x-request-id as a session key source"


def test_shared_prefix_outlives_its_tails_under_a_worker_cap(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 2, extra=["--worker-index-blocks", "12"])
    c = clients(kv)
    system = {"role": "system", "content": "S" * (64 * 5)}  # ~5 blocks shared by every request
    owner = None
    for i in range(20):  # ~9 blocks each, all on one worker (one session): 12 fit
        r = c.chat([system, {"role": "user", "content": unique_text(i, "tail") + "T" * 100}],
                   session="one")
        owner = owner or r.worker
        assert r.worker == owner
    assert metric(kv, "kvroute_index_evictions_total", model=SIM_MODEL) > 0
    assert metric(kv, "kvroute_index_blocks", model=SIM_MODEL) <= 12
    r = c.chat([system, {"role": "user", "content": unique_text(999, "new") + "T" * 100}])
    assert r.decision == "prefix_match" and r.worker == owner, \
        "the shared head was evicted before the tails: %r" % r
    assert r.match >= 0.5, r


def test_block_bytes_flag(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 1, extra=["--block-bytes", "16",
                                                    "--teach-completion-max-bytes", "0"])
    c = clients(kv)
    c.complete("x" * 100)  # a string prompt is its bytes: 6 full blocks of 16 + a partial one
    assert metric(kv, "kvroute_index_blocks", model=SIM_MODEL) == 7


def test_hanging_worker_metrics_do_not_block_routing(stub, kvroute, clients):
    hang = stub(mode="hang")  # every request without its own x-stub-mode hangs: /metrics too
    ok = stub()
    kv = kvroute([hang, ok], policy="cache_aware", health_interval_ms=0,
                 extra=["--scrape-interval", "1"])
    c = clients(kv, model=MODEL)
    t_end = time.monotonic() + 2.5
    worst = 0.0
    n = 0
    while time.monotonic() < t_end:
        t = time.monotonic()
        r = c.ask(unique_text(n, "hang"), headers={"x-stub-mode": "json"})
        worst = max(worst, time.monotonic() - t)
        n += 1
        assert r.status == 200
        time.sleep(0.02)
    assert worst < 0.5, "a request took %.2fs while a worker's /metrics hung" % worst
    scrapes = hang.requests(path="/metrics", prefix=None)
    assert 1 <= len(scrapes) <= 4, "scrapes of the hanging worker: %d in ~2.5 s" % len(scrapes)
    assert sum(1 for e in scrapes if e["ended"] == "in_progress") <= 1, \
        "hung scrapes pile up instead of timing out"
    # SIGTERM with a scrape hanging: a clean exit (an ASan build checks memory safety here)
    kv.proc.signal(signal.SIGTERM)
    assert kv.proc.wait(10) == 0, kv.proc.stderr_text(30)


def test_max_index_blocks_cap_holds_under_traffic(sim_factory, kvroute, clients):
    _, kv = sims_kv(sim_factory, kvroute, 2, extra=["--max-index-blocks", "40"])
    c = clients(kv)
    worst = 0
    for i in range(40):  # ~8 blocks each: 320 blocks offered
        c.ask(unique_text(i, "cap") + " padding" * 50)
        worst = max(worst, metric(kv, "kvroute_index_blocks", model=SIM_MODEL))
    assert worst <= 40, "kvroute_index_blocks %d above --max-index-blocks 40" % worst
    m = kv.metrics()
    assert m.get("kvroute_index_blocks", model=SIM_MODEL) > 0
    assert m.get("kvroute_index_evictions_total", model=SIM_MODEL) > 0
    # the most recent text is still matched in full
    r = c.ask(unique_text(39, "cap") + " padding" * 50)
    assert r.decision == "prefix_match" and r.match_hdr == "1.00", r


def test_worker_index_cap_from_published_kv_capacity(sim_factory, kvroute, clients):
    admin = free_port()
    sims = [sim_factory("--time-scale", "0", "--kv-blocks", "64") for _ in range(2)]
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=0,
                 extra=["--scrape-interval", "1", "--admin-port", admin])
    c = clients(kv)

    def workers():
        return httpx.get("http://127.0.0.1:%d/workers" % admin, timeout=5, verify=SSL_CTX).json()

    wait_until(lambda: all(w["kv_tokens"] == 64 * 16 for w in workers()["workers"]), 5,
               what="kv capacity scraped from vllm:cache_config_info")
    for i in range(60):  # ~8 blocks each: 480 blocks offered to 2 workers
        c.ask(unique_text(i, "kvcap") + " padding" * 50)
    ws = workers()["workers"]
    for w in ws:
        # 64 blocks × 16 tokens ≈ 64 blocks of 64 bytes of text
        assert w["index_capacity"] == 64, w
        assert 0 < w["index_blocks"] <= 64, w
    assert metric(kv, "kvroute_index_blocks", model=SIM_MODEL) <= 128


def test_worker_queue_and_kv_usage_are_scraped(sim_factory, kvroute, clients):
    sims = [sim_factory("--time-scale", "1", "--max-num-seqs", "1", "--kv-blocks", "64")
            for _ in range(2)]
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=0,
                 extra=["--scrape-interval", "1"])
    c = clients(kv)

    def families():
        m = kv.metrics()
        return {lb.get("worker") for lb, _ in m.find("kvroute_worker_queue")}, \
               {lb.get("worker") for lb, _ in m.find("kvroute_worker_kv_usage")}
    urls = {s.url for s in sims}
    wait_until(lambda: families() == (urls, urls), 4, what="kvroute_worker_queue/_kv_usage "
               "for every worker")
    # load one worker: one running (max-num-seqs 1, holding KV blocks), the rest waiting
    owner = c.ask("warm the session", session="q").worker
    seen_q, seen_kv = [0.0], [0.0]
    with concurrent.futures.ThreadPoolExecutor(5) as ex:
        futs = [ex.submit(c.ask, unique_text(i, "load") + " words" * 40, "q", max_tokens=100)
                for i in range(4)]

        def moved():
            m = kv.metrics()
            seen_q[0] = max(seen_q[0], m.get("kvroute_worker_queue", worker=owner))
            seen_kv[0] = max(seen_kv[0], m.get("kvroute_worker_kv_usage", worker=owner))
            return seen_q[0] >= 1 and seen_kv[0] > 0
        try:
            wait_until(moved, 6, interval=0.1, what="scraped queue and kv usage to move")
        finally:
            [f.result(timeout=30) for f in futs]
    m = kv.metrics()
    for lb, v in m.find("kvroute_worker_kv_usage"):
        assert 0 <= v <= 1, (lb, v)


def test_scrape_interval_zero_turns_scraping_off(sim_factory, kvroute):
    sims = [sim_factory("--time-scale", "0")]
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", health_interval_ms=0,
                 extra=["--scrape-interval", "0"])
    time.sleep(1.2)
    m = kv.metrics()
    assert not m.find("kvroute_worker_queue") and not m.find("kvroute_worker_kv_usage"), \
        m.find("kvroute_worker_queue")


# ============================================================================ consistent_hash, rendezvous_hash
@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_hash_policies_stick_by_session_and_first_block(sim_factory, kvroute, clients, policy):
    sims, kv = sims_kv(sim_factory, kvroute, 4, policy=policy)
    c = clients(kv)
    owners = {}
    for i in range(30):
        sid = "hs-%d" % i
        for j in range(3):  # unrelated texts: only the session key can keep them together
            r = c.ask(unique_text(1000 * i + j, "hs"), session=sid)
            assert r.decision == policy, r
            owners.setdefault(sid, r.worker)
            assert r.worker == owners[sid], (sid, owners[sid], r)
    assert len(set(owners.values())) >= 3, "sessions do not spread: %r" % collections.Counter(
        owners.values())
    # 160 virtual nodes per worker (or one score per worker): keys spread near evenly
    share = collections.Counter(c.ask("k", session="spread-%d" % i).worker for i in range(400))
    assert len(share) == 4 and all(60 <= v <= 140 for v in share.values()), share
    # no session: the first 64-byte block of the routing text is the key
    fam = {}
    for i in range(20):
        head = "family %03d shares this whole first block of routing text, byte for byte." % i
        assert len(head) > 64
        for j in range(3):
            r = c.ask(head + " then tail %d differs " % j + "z" * (j * 40))
            fam.setdefault(i, r.worker)
            assert r.worker == fam[i], (i, j, r)
    assert len(set(fam.values())) >= 2, fam


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_hash_policies_are_deterministic_and_move_only_a_lost_workers_keys(
        sim_factory, kvroute, clients, policy):
    sims = [sim_factory("--time-scale", "0") for _ in range(4)]
    keys = ["det-%d" % i for i in range(60)]

    def mapping(kv):
        c = clients(kv)
        return {k: c.ask(unique_text(i, "det"), session=k).worker for i, k in enumerate(keys)}
    kv1 = kvroute(sims, model=SIM_MODEL, policy=policy, health_interval_ms=100)
    m1 = mapping(kv1)
    assert mapping(kv1) == m1
    # another kvroute, workers listed in another order: the same owners (keyed by URL)
    kv2 = kvroute(list(reversed(sims)), model=SIM_MODEL, policy=policy, health_interval_ms=0)
    assert mapping(kv2) == m1, "%s mapping depends on the process or the worker order" % policy
    kv2.stop()
    # a worker fails its health checks: only its keys move, each to one other worker
    lost = collections.Counter(m1.values()).most_common(1)[0][0]
    ls = next(s for s in sims if s.url == lost)
    ls.faults(health_status=503)
    try:
        wait_until(lambda: kv1.metrics().get("kvroute_worker_healthy", worker=lost) == 0, 5,
                   what="the owner to be marked unhealthy")
        m2 = mapping(kv1)
        for k in keys:
            if m1[k] != lost:
                assert m2[k] == m1[k], "key %s moved although its worker stayed: %s → %s" % (
                    k, m1[k], m2[k])
            else:
                assert m2[k] != lost, k
        assert mapping(kv1) == m2  # the passed-on keys are stable too
        moved_to = collections.Counter(m2[k] for k in keys if m1[k] == lost)
        assert len(moved_to) >= 2, "a lost worker's keys all went to one worker: %r" % moved_to
    finally:
        ls.faults(health_status=200)
    wait_until(lambda: kv1.metrics().get("kvroute_worker_healthy", worker=lost) == 1, 5,
               what="the owner to be healthy again")
    assert mapping(kv1) == m1, "keys did not return to their owner"


# ============================================================================ completion teaching
@pytest.mark.parametrize("stream", [False, True])
def test_completion_teaching_follow_up_without_session_id(sim_factory, kvroute, clients, stream):
    """The reply joins the taught text when the answer completes, framed as the next turn sends
    it: turn 2, sent with no session id, matches >= 0.9 and lands on turn 1's worker."""
    _, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    msgs = [{"role": "user", "content": unique_text(7, "q")}]
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    r1 = c.chat(msgs, max_tokens=200, **extra)
    if stream:
        reply = "".join((json.loads(ln[5:]).get("choices") or [{}])[0].get("delta", {})
                        .get("content") or ""
                        for ln in r1.text.splitlines()
                        if ln.startswith("data:") and ln.strip() != "data: [DONE]")
    else:
        reply = r1.json()["choices"][0]["message"]["content"]
    assert len(reply) > 200, reply
    msgs2 = msgs + [{"role": "assistant", "content": reply},
                    {"role": "user", "content": "and then?"}]
    r2 = c.chat(msgs2)
    assert r2.worker == r1.worker, (r1, r2)
    assert r2.decision == "prefix_match" and r2.match >= 0.9, r2
    # off: only the prompt is known, so the follow-up matches much less
    _, kv0 = sims_kv(sim_factory, kvroute, 4, extra=["--teach-completion-max-bytes", "0"])
    c0 = clients(kv0)
    c0.chat(msgs, max_tokens=200, **extra)
    assert c0.chat(msgs2).match < 0.9


# ============================================================================ even load
def test_new_conversations_sharing_a_system_prompt_spread(sim_factory, kvroute, clients):
    """Conversations that open with the same long system prompt: each new one matches that
    prompt on the first worker that cached it, but they must not all pile onto it; their
    follow-ups still stay where they started."""
    sims, kv = sims_kv(sim_factory, kvroute, 4)
    c = clients(kv)
    system = {"role": "system", "content": " ".join("policy%d" % i for i in range(600))}
    first = {}
    for conv in range(20):  # one at a time: in-flight load never tells them apart
        msgs = [system, {"role": "user", "content": "conversation %d asks %s" % (
            conv, unique_text(conv, "q"))}]
        r = c.chat(msgs, max_tokens=8)
        first[conv] = (msgs, r)
    counts = {}
    for _, r in first.values():
        counts[r.worker] = counts.get(r.worker, 0) + 1
    assert max(counts.values()) <= 7 and len(counts) == 4, counts
    for conv, (msgs, r) in first.items():  # turn 2, no session id: back to its worker
        reply = r.json()["choices"][0]["message"]["content"]
        r2 = c.chat(msgs + [{"role": "assistant", "content": reply},
                            {"role": "user", "content": "thanks"}])
        assert r2.worker == r.worker and r2.decision == "prefix_match", (conv, r, r2)
# ============================================================================ self-correcting index
@pytest.mark.parametrize("completion_teaching", [False, True])
def test_self_correcting_index(sim_factory, kvroute, clients, completion_teaching):
    """P2 then P1 taught to worker W; W's prefix cache is flushed; P1 sent again: W reports few
    cached tokens, so kvroute drops what W had used no later than P1 (P2) and counts a
    correction; P1, just recomputed there, still matches."""
    admin = free_port()
    extra = ["--admin-port", admin]
    if not completion_teaching:
        extra += ["--teach-completion-max-bytes", "0"]
    (sim,), kv = sims_kv(sim_factory, kvroute, 1, extra=extra)
    c = clients(kv)
    p1, p2 = unique_text(1, "selfcorr") * 8, unique_text(2, "selfcorr") * 8

    def explain(text):
        body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": text}]}
        r = httpx.post("http://127.0.0.1:%d/debug/route" % admin, json=body, timeout=5,
                       verify=SSL_CTX)
        assert r.status_code == 200, r.text
        ex = r.json()
        (row,) = ex["workers"]
        return row, ex["routing_text_bytes"]

    def corrections():
        return metric(kv, "kvroute_index_corrections_total", model=SIM_MODEL,
                      worker=sim.url) or 0

    def capacity():
        ws = httpx.get("http://127.0.0.1:%d/workers" % admin, timeout=5,
                       verify=SSL_CTX).json()["workers"]
        return ws[0]["index_capacity"]

    c.ask(p2)
    c.ask(p1)
    for text in (p2, p1):
        row, n = explain(text)
        assert row["matched_bytes"] == n and row["match"] == 1.0, row
    # While the worker holds what the index says, repeats correct nothing.
    r = c.ask(p1)
    assert r.match_hdr == "1.00", r
    full_cap = capacity()
    # The cache is flushed behind kvroute's back.
    assert sim.client.post("/sim/reset_prefix_cache").status_code == 200
    r = c.ask(p1)
    assert r.worker == sim.url and r.match_hdr == "1.00", r  # still predicted in full...
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 16  # ...but gone
    wait_until(lambda: corrections() == 1, 5, what="a correction counted")
    row, n = explain(p2)
    assert row["matched_bytes"] == 0 and row["match"] == 0, row  # P2 is no longer predicted
    row, n = explain(p1)
    assert row["matched_bytes"] == n and row["match"] == 1.0, row  # P1 was recomputed there
    assert capacity() < full_cap  # the estimate fell to what remains
    # P1 now really is cached there: no further correction.
    r = c.ask(p1)
    assert r.match_hdr == "1.00" and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    time.sleep(0.2)
    assert corrections() == 1
