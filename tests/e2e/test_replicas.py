"""Several kvroute replicas sharing routing state through Redis (issue 19, DESIGN §13).

Each test starts its own redis-server on a free loopback port (no persistence), kvroute-sim
workers and two or three kvroute replicas with the same --redis and key prefix, and checks
what the others learn from one replica's traffic: failover to a replica that never saw the
conversations, a replica started late, sessions continued elsewhere, load seen across
replicas, and Redis dying or freezing under traffic. Every process is stopped by pid; every
wait is bounded.
"""
import concurrent.futures
import json
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from conftest import SIM_MODEL, SSL_CTX, Proc, free_port, wait_until

REDIS_BIN = "/usr/bin/redis-server"
LONG = ("You are a careful airline agent. Follow the policy exactly, check the reservation "
        "before changing it, and never guess a passenger's details. ") * 6


class Redis:
    """A redis-server on 127.0.0.1:port, no persistence; stopped by pid at teardown."""

    def __init__(self, procs, tmp_path, port=None, extra=()):
        self.extra = extra
        if not Path(REDIS_BIN).exists():
            pytest.skip("redis-server not installed (scripts/install-deps.sh)")
        self.procs, self.tmp_path = procs, tmp_path
        self.port = port or free_port()
        self.url = "redis://127.0.0.1:%d" % self.port
        self.start()

    def start(self):
        argv = [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no"] + list(self.extra)
        self.proc = Proc(argv, Path(self.tmp_path) / ("redis-%d.stderr" % len(self.procs.procs)))
        self.procs.procs.append(self.proc)
        wait_until(self.ping, 5.0, what="redis-server answering PING")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64)[:1] in (b"+", b"-")  # PONG, or NOAUTH: it answers
        except OSError:
            return False

    def kill(self):
        self.proc.signal(signal.SIGKILL)
        self.proc.wait(5.0)

    def stop_signal(self):
        self.proc.signal(signal.SIGSTOP)

    def cont(self):
        self.proc.signal(signal.SIGCONT)


def metric(kv, name, **labels):
    return kv.metrics().get(name, **labels)


def replica(kvroute, workers, redis, rid, policy="cache_aware", extra=()):
    return kvroute(workers, model=SIM_MODEL, policy=policy,
                   extra=["--redis", redis.url, "--replica-id", rid, "--admin-port",
                          str(free_port()), "--redis-stall-ms", "300", *extra])


def wait_ready(kv, timeout=10.0):
    wait_until(lambda: kv.get("/readyz").status_code == 200, timeout, what="/readyz 200")


def chat(kv, messages, session=None, max_tokens=8, timeout=10.0):
    headers = {"x-session-id": session} if session else None
    r = kv.post("/v1/chat/completions", {"model": SIM_MODEL, "messages": messages,
                                         "max_tokens": max_tokens}, headers=headers,
                timeout=timeout)
    assert r.status_code == 200, r.text
    return r


def first_turn(i):
    return [{"role": "system", "content": LONG},
            {"role": "user", "content": "conversation %d: I need to change my flight %d, "
                                        "reservation code X%05d, to the next morning." % (i, i, i)}]


def next_turn(msgs, reply):
    return msgs + [{"role": "assistant", "content": reply},
                   {"role": "user", "content": "yes"}]


def reply_text(r):
    return r.json()["choices"][0]["message"]["content"]


def wait_applied(kv, n, timeout=5.0):
    """Waits until `kv` applied at least n log entries from the others."""
    wait_until(lambda: metric(kv, "kvroute_redis_log_entries_total", direction="in") >= n,
               timeout, what="%d routing-log entries applied" % n)


def out_count(kv):
    return metric(kv, "kvroute_redis_log_entries_total", direction="out")


def four_sims(sim_factory, *args):
    return [sim_factory("--time-scale", "0", *args) for _ in range(4)]


# ============================================================================ tests
def test_failover_next_turns_through_b_land_on_the_same_worker(procs, tmp_path, sim_factory,
                                                              kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    a = replica(kvroute, sims, redis, "a")
    b = replica(kvroute, sims, redis, "b")
    convs = []
    for i in range(50):
        msgs = first_turn(i)
        r = chat(a, msgs)
        convs.append((msgs, reply_text(r), r.headers["x-kvroute-worker"]))
    assert len({w for _, _, w in convs}) >= 3, "the first turns were not spread"
    wait_until(lambda: out_count(a) >= 100, 5.0, what="A wrote its entries")
    wait_applied(b, 100)
    a.proc.signal(signal.SIGKILL)
    a.proc.wait(5.0)
    same = 0
    for msgs, reply, worker in convs:
        r = chat(b, next_turn(msgs, reply))
        same += r.headers["x-kvroute-worker"] == worker
    assert same >= 48, "only %d/50 next turns through B reached their worker" % same


def test_late_replica_routes_an_old_conversation_on_its_first_request(procs, tmp_path,
                                                                       sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    a = replica(kvroute, sims, redis, "a")
    convs = []
    for i in range(12):
        msgs = first_turn(i)
        r = chat(a, msgs)
        convs.append((msgs, reply_text(r), r.headers["x-kvroute-worker"]))
    wait_until(lambda: out_count(a) >= 24, 5.0, what="A wrote its entries")
    c = replica(kvroute, sims, redis, "c")
    wait_ready(c)
    msgs, reply, worker = convs[7]
    r = chat(c, next_turn(msgs, reply))
    assert r.headers["x-kvroute-worker"] == worker
    assert float(r.headers["x-kvroute-match"]) >= 0.9, r.headers
    assert metric(c, "kvroute_redis_log_entries_total", direction="in") >= 24
    # the warm start is visible on the admin port
    cl = httpx.get("http://127.0.0.1:%s/cluster" % c.argv[c.argv.index("--admin-port") + 1],
                   timeout=5.0, verify=SSL_CTX).json()
    assert cl["enabled"] and cl["warm"] and cl["redis_up"] and cl["replica_id"] == "c"
    assert cl["log"]["in"] >= 24 and cl["replicas"][0]["id"] == "c"

    def seen():
        j = httpx.get("http://127.0.0.1:%s/cluster" % c.argv[c.argv.index("--admin-port") + 1],
                      timeout=5.0, verify=SSL_CTX).json()
        return {r["id"]: r for r in j["replicas"]}, j["live_replicas"]
    wait_until(lambda: "a" in seen()[0], 3.0, what="C lists A")
    reps, live = seen()
    assert live == 2 and reps["a"]["load_age_ms"] < 1000 and reps["a"]["log_position"]


def test_readyz_waits_for_the_replay(procs, tmp_path, sim_factory, kvroute):
    """Without Redis answering, /readyz stays 503 until --redis-warm-timeout-ms, then the
    replica serves alone (Redis is never needed to route)."""
    sims = four_sims(sim_factory)
    dead = "redis://127.0.0.1:%d" % free_port()
    admin = free_port()
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware",
                 extra=["--redis", dead, "--redis-warm-timeout-ms", "1500",
                        "--admin-port", str(admin)])
    t0 = time.monotonic()
    assert kv.get("/readyz").status_code == 503
    # Never reached: it counts itself live, with no load exchange to date.
    cl = httpx.get("http://127.0.0.1:%d/cluster" % admin, timeout=5.0).json()
    assert cl["redis_up"] is False and cl["live_replicas"] == 1, cl
    assert cl["replicas"][0]["self"] and cl["replicas"][0]["load_age_ms"] is None, cl
    assert kv.get("/readyz").json()["cluster_warm"] is False
    chat(kv, first_turn(1))  # routing never waits for Redis
    wait_ready(kv, timeout=5.0)
    assert time.monotonic() - t0 >= 1.0
    m = kv.metrics()
    assert m.get("kvroute_redis_up") == 0
    assert m.get("kvroute_redis_errors_total", op="connect") >= 1


def test_session_bound_through_a_continues_through_b(procs, tmp_path, sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    a = replica(kvroute, sims, redis, "a")
    b = replica(kvroute, sims, redis, "b")
    bound = {}
    for i in range(8):
        r = chat(a, [{"role": "user", "content": "hi %d" % i}], session="sess-%d" % i)
        bound[i] = r.headers["x-kvroute-worker"]
    assert len(set(bound.values())) >= 2
    wait_applied(b, 8)
    for i in range(8):
        # unrelated text: only the session id can take it there
        r = chat(b, [{"role": "user", "content": "something else entirely %d" % (i * 7)}],
                 session="sess-%d" % i)
        assert r.headers["x-kvroute-decision"] == "session_id_match", r.headers
        assert r.headers["x-kvroute-worker"] == bound[i]
    # a prefix of a session id is another session (DESIGN §5)
    r = chat(b, [{"role": "user", "content": "x"}], session="sess-")
    assert r.headers["x-kvroute-decision"] != "session_id_match"


def test_least_load_sees_the_other_replicas_load(procs, tmp_path, sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    for s in sims:
        s.faults(delay_ms=3000)
    w1 = sims[0]
    a = replica(kvroute, [w1], redis, "a", policy="least_load",
                extra=["--redis-load-interval-ms", "50"])
    b = replica(kvroute, sims, redis, "b", policy="least_load",
                extra=["--redis-load-interval-ms", "50"])
    pool = concurrent.futures.ThreadPoolExecutor(24)
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "slow"}],
            "max_tokens": 2}
    held = [pool.submit(a.post, "/v1/chat/completions", body, None, None, 20.0)
            for _ in range(12)]
    wait_until(lambda: a.inflight().get(w1.url) == 12, 5.0, what="12 held on W1 through A")
    # B sees them once A published (every 50 ms, read back on B's next poll)
    admin_b = "http://127.0.0.1:%s/cluster" % b.argv[b.argv.index("--admin-port") + 1]
    wait_until(lambda: any(r["id"] == "a" for r in httpx.get(admin_b, timeout=2.0,
                                                             verify=SSL_CTX)
                           .json()["replicas"]), 5.0, what="B sees A")
    time.sleep(0.3)
    assert metric(b, "kvroute_cluster_replicas") == 2
    sent = [pool.submit(b.post, "/v1/chat/completions", body, None, None, 20.0)
            for _ in range(12)]
    workers = [f.result().headers["x-kvroute-worker"] for f in sent]
    for f in held:
        assert f.result().status_code == 200
    pool.shutdown()
    assert workers.count(w1.url) <= 1, workers


def test_redis_killed_then_stopped_during_a_replay(procs, tmp_path, sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    a = replica(kvroute, sims, redis, "a", extra=["--redis-timeout-ms", "5"])
    b = replica(kvroute, sims, redis, "b", extra=["--redis-timeout-ms", "5"])
    stop = {"flag": False}
    lat, errors = [], []

    def traffic(kv, base):
        i = 0
        with httpx.Client(timeout=10.0, verify=SSL_CTX) as cl:
            while not stop["flag"]:
                i += 1
                t = time.monotonic()
                try:
                    r = cl.post(kv.url + "/v1/chat/completions",
                                json={"model": SIM_MODEL, "max_tokens": 2,
                                      "messages": [{"role": "user",
                                                    "content": "replay %d %d" % (base, i % 40)}]})
                    if r.status_code != 200:
                        errors.append(r.status_code)
                except httpx.HTTPError as e:
                    errors.append(repr(e))
                lat.append(time.monotonic() - t)

    pool = concurrent.futures.ThreadPoolExecutor(2)
    futs = [pool.submit(traffic, a, 1), pool.submit(traffic, b, 2)]
    try:
        time.sleep(0.5)
        base = sorted(lat)[len(lat) // 2]
        redis.kill()
        wait_until(lambda: metric(a, "kvroute_redis_up") == 0 and
                   metric(b, "kvroute_redis_up") == 0, 3.0, what="redis_up 0 after SIGKILL")
        time.sleep(0.5)
        redis.start()  # same port, empty
        t0 = time.monotonic()
        wait_until(lambda: metric(a, "kvroute_redis_up") == 1 and
                   metric(b, "kvroute_redis_up") == 1, 3.0, what="redis_up 1 again")
        assert time.monotonic() - t0 < 2.5
        time.sleep(0.3)
        redis.stop_signal()
        wait_until(lambda: metric(a, "kvroute_redis_up") == 0 and
                   metric(b, "kvroute_redis_up") == 0, 3.0, what="redis_up 0 when SIGSTOPped")
        time.sleep(0.5)
        redis.cont()
        wait_until(lambda: metric(a, "kvroute_redis_up") == 1 and
                   metric(b, "kvroute_redis_up") == 1, 3.0, what="redis_up 1 after SIGCONT")
    finally:
        redis.cont()
        stop["flag"] = True
        for f in futs:
            f.result(timeout=15)
        pool.shutdown()
    assert not errors, errors[:5]
    assert len(lat) > 50
    # routing never waited on Redis: no request far slower than the steady state
    slow = [x for x in lat if x > base + 0.25]
    assert len(slow) <= len(lat) // 100, (base, sorted(lat)[-5:])
    assert metric(a, "kvroute_redis_errors_total", op="stall") >= 1
    # the replicas agree again: a conversation taught through A is routed through B
    msgs = first_turn(999)
    before = metric(b, "kvroute_redis_log_entries_total", direction="in")
    r = chat(a, msgs)
    wait_applied(b, before + 2)  # the prompt at the headers, then prompt + reply
    r2 = chat(b, next_turn(msgs, reply_text(r)))
    assert r2.headers["x-kvroute-worker"] == r.headers["x-kvroute-worker"]
    assert float(r2.headers["x-kvroute-match"]) >= 0.9


def test_bad_redis_settings_are_refused(procs, tmp_path, sim_factory, kvroute):
    import subprocess
    from conftest import KVROUTE_BIN
    for url, msg in [("rediss://127.0.0.1:6379", "TLS"), ("http://x", "not a redis:// URL"),
                     ("redis://127.0.0.1:0", "port"), ("redis://:pw@", "host")]:
        p = subprocess.run([str(KVROUTE_BIN), "--worker", "http://127.0.0.1:1", "--model", "m",
                            "--redis", url, "--check"], capture_output=True, text=True,
                           timeout=10)
        assert p.returncode != 0 and msg in p.stdout + p.stderr, (url, p.stdout, p.stderr)
    cfg = Path(tmp_path) / "c.yaml"
    cfg.write_text("workers: [http://127.0.0.1:1]\nmodel: m\n"
                   "redis: {url: 'redis://127.0.0.1:1/2', key_prefix: 'x:', password_file: "
                   "/nonexistent}\n")
    p = subprocess.run([str(KVROUTE_BIN), "--config", str(cfg), "--check"], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode != 0 and "/nonexistent" in p.stdout, p.stdout
    cfg.write_text("workers: [http://127.0.0.1:1]\nmodel: m\nredis: {urll: x}\n")
    p = subprocess.run([str(KVROUTE_BIN), "--config", str(cfg), "--check"], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode != 0 and "urll" in p.stdout, p.stdout


def rate_config(tmp_path, sims, redis):
    keys = Path(tmp_path) / "keys"
    keys.write_text("limited:sk-limited-0123456789\nfree:sk-free-0123456789\n")
    cfg = Path(tmp_path) / "kvroute.yaml"
    cfg.write_text("model: %s\nauth: {api_keys_file: \"%s\"}\nhealth_interval_ms: 0\n"
                   "rate_limits:\n  limited: {requests_per_minute: 10}\n"
                   "redis: {url: \"%s\", key_prefix: \"t19:\"}\n"
                   "workers: [%s]\n" % (SIM_MODEL, keys, redis.url,
                                        ", ".join('"%s"' % s.url for s in sims)))
    return cfg


def keyed_chat(kv, key, i):
    return kv.post("/v1/chat/completions",
                   {"model": SIM_MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "limited %d" % i}]},
                   headers={"authorization": "Bearer " + key})


def test_requests_per_minute_counts_across_two_replicas(procs, tmp_path, sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)[:2]
    cfg = rate_config(tmp_path, sims, redis)
    a = kvroute([], model=None, policy=None, extra=["--config", cfg, "--replica-id", "a"])
    b = kvroute([], model=None, policy=None, extra=["--config", cfg, "--replica-id", "b"])
    wait_until(lambda: metric(a, "kvroute_redis_up") == 1 and metric(b, "kvroute_redis_up") == 1,
               5.0, what="both replicas connected")
    for i in range(10):
        r = keyed_chat(a if i % 2 else b, "sk-limited-0123456789", i)
        assert r.status_code == 200, (i, r.text)
    r = keyed_chat(a, "sk-limited-0123456789", 10)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    r = keyed_chat(b, "sk-limited-0123456789", 11)
    assert r.status_code == 429
    # another key has no limit
    for i in range(12):
        assert keyed_chat(a if i % 2 else b, "sk-free-0123456789", i).status_code == 200


def test_requests_per_minute_without_redis_is_shared_by_the_live_replicas(procs, tmp_path,
                                                                         sim_factory, kvroute):
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)[:2]
    cfg = rate_config(tmp_path, sims, redis)
    a = kvroute([], model=None, policy=None, extra=["--config", cfg, "--replica-id", "a"])
    b = kvroute([], model=None, policy=None, extra=["--config", cfg, "--replica-id", "b"])
    wait_until(lambda: metric(a, "kvroute_cluster_replicas") == 2 and
               metric(b, "kvroute_cluster_replicas") == 2, 5.0, what="both see two replicas")
    redis.kill()
    wait_until(lambda: metric(a, "kvroute_redis_up") == 0, 3.0, what="redis_up 0")
    codes = []
    for i in range(8):
        t = time.monotonic()
        codes.append(keyed_chat(a, "sk-limited-0123456789", i).status_code)
        assert time.monotonic() - t < 1.0
    # 10 per minute over two live replicas: 5 here
    assert codes == [200] * 5 + [429] * 3, codes


def compare(tmp_path, name, *args):
    import os
    import subprocess
    from conftest import BUILD
    root = Path(__file__).resolve().parents[2]
    out = Path(tmp_path) / (name + ".json")
    env = dict(os.environ, KVROUTE_BUILD=str(BUILD))
    p = subprocess.run(["bash", str(root / "scripts/compare.sh"), "--trace",
                        str(root / "data/tau-bench-airline-gpt4o"), "--format", "tau",
                        "--time-scale", "0.05", "--max-requests", "400", "--no-bound",
                        "--json", str(out), *args], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())["policies"]


def test_three_replicas_sharing_redis_keep_the_cache_aware_gain(tmp_path):
    """tau-bench spread per request (round robin) over three replicas: with Redis the fleet
    hit rate keeps >= 90 % of one replica's gain over round robin; without it, the same run is
    recorded beside it (it loses a large part of the gain)."""
    if not Path(REDIS_BIN).exists():
        pytest.skip("redis-server not installed")
    one = compare(tmp_path, "one", "--policies", "round_robin,cache_aware", "--replicas", "1")
    shared = compare(tmp_path, "shared", "--policies", "cache_aware", "--replicas", "3",
                     "--shared-state", "redis")
    alone = compare(tmp_path, "alone", "--policies", "cache_aware", "--replicas", "3",
                    "--shared-state", "none")
    rr = one["round_robin"]["hit_rate"]
    gain1 = one["cache_aware"]["hit_rate"] - rr
    gain_shared = shared["cache_aware"]["hit_rate"] - rr
    gain_alone = alone["cache_aware"]["hit_rate"] - rr
    record = {"round_robin": rr, "one_replica": one["cache_aware"]["hit_rate"],
              "three_redis": shared["cache_aware"]["hit_rate"],
              "three_none": alone["cache_aware"]["hit_rate"],
              "kept_redis": gain_shared / gain1, "kept_none": gain_alone / gain1,
              "load_max_over_mean_redis": shared["cache_aware"]["load_max_over_mean"]}
    print("replicas hit rate (tau-bench, 400 requests): %s" % json.dumps(record))
    assert gain1 > 0.05, record
    assert all(p["errors"] == 0 for p in (one["cache_aware"], shared["cache_aware"],
                                          alone["cache_aware"])), record
    assert gain_shared >= 0.9 * gain1, record


def test_a_correction_through_a_reaches_b(procs, tmp_path, sim_factory, kvroute):
    """A worker that evicted a conversation is found out by A (it reports fewer cached tokens
    than predicted): B applies the same correction (drops what W1 lost, lowers its cap)."""
    redis = Redis(procs, tmp_path)
    w1 = sim_factory("--time-scale", "0", "--kv-blocks", "96")
    w2 = sim_factory("--time-scale", "0")
    # both believe W1 holds far more than it does (its cache is 96 blocks): A finds out
    over = ["--teach-completion-max-bytes", "0", "--worker-index-blocks", "100000"]
    a = replica(kvroute, [w1], redis, "a", extra=over)
    b = replica(kvroute, [w1, w2], redis, "b", extra=over)
    admin_b = "http://127.0.0.1:%s" % b.argv[b.argv.index("--admin-port") + 1]

    def match_on_w1(msgs):
        r = httpx.post(admin_b + "/debug/route", json={"model": SIM_MODEL, "messages": msgs},
                       timeout=5.0, verify=SSL_CTX)
        assert r.status_code == 200, r.text
        return {x["url"]: x["match"] for x in r.json()["workers"]}[w1.url]

    def unique(i):
        return [{"role": "user", "content": " ".join("c%d-%d" % (i, j) for j in range(150))}]

    x = unique(1)
    chat(a, x)
    wait_until(lambda: match_on_w1(x) == 1.0, 5.0, what="B learned X on W1")
    # other long conversations through A push X out of W1's small cache
    for i in range(2, 12):
        chat(a, unique(i))
    before = metric(a, "kvroute_index_corrections_total")
    r = chat(a, x)  # W1 reports less cached than A predicted: A corrects and tells B
    m = a.metrics()
    assert m.get("kvroute_index_corrections_total") > before, (
        r.headers, r.json().get("usage"), m.find("kvroute_index_corrections_total"))

    def capacity_on_w1():
        ws = httpx.get(admin_b + "/workers", timeout=5.0, verify=SSL_CTX).json()["workers"]
        return {w["url"]: w["index_capacity"] for w in ws}[w1.url]

    # B applied the same correction: W1's cap came down from the flag's 100000 to what is
    # left (A's and B's indexes agree again), and X, which W1 has just cached, is taught again
    wait_until(lambda: capacity_on_w1() < 100000, 5.0, what="B lowered W1's capacity")
    assert match_on_w1(x) == 1.0


def test_password_file_and_db(procs, tmp_path, sim_factory, kvroute):
    """A Redis with a password: the password file's first line authenticates, in the URL's
    db; a wrong one keeps kvroute_redis_up at 0 (counted as auth), and routing goes on."""
    redis = Redis(procs, tmp_path, extra=("--requirepass", "s3cret"))
    good, bad = Path(tmp_path) / "pw", Path(tmp_path) / "bad"
    good.write_text("s3cret\n")
    bad.write_text("nope\n")
    sims = four_sims(sim_factory)[:2]
    url = redis.url + "/5"
    a = kvroute(sims, model=SIM_MODEL, policy="cache_aware",
                extra=["--redis", url, "--redis-password-file", good, "--replica-id", "a"])
    b = kvroute(sims, model=SIM_MODEL, policy="cache_aware",
                extra=["--redis", url, "--redis-password-file", bad, "--replica-id", "b",
                       "--redis-warm-timeout-ms", "500"])
    wait_until(lambda: metric(a, "kvroute_redis_up") == 1, 5.0, what="A authenticated")
    r = chat(a, first_turn(1), session="pw-1")
    wait_until(lambda: out_count(a) >= 2, 5.0, what="A wrote to the log")
    wait_until(lambda: metric(b, "kvroute_redis_errors_total", op="auth") >= 1, 5.0,
               what="B refused")
    assert metric(b, "kvroute_redis_up") == 0
    wait_ready(b)
    assert chat(b, first_turn(2)).status_code == 200  # B routes alone
    # the log is in db 5, and no key holds the session id or the text
    with socket.create_connection(("127.0.0.1", redis.port), timeout=2.0) as s:
        s.sendall(b"AUTH s3cret\r\nSELECT 5\r\nXLEN kvroute:log\r\nSELECT 0\r\nDBSIZE\r\n"
                  b"SELECT 5\r\nXRANGE kvroute:log - +\r\n")
        time.sleep(0.3)
        data = s.recv(1 << 20)
    lines = data.split(b"\r\n")
    assert lines[0] == b"+OK" and lines[1] == b"+OK"
    assert int(lines[2][1:]) >= 2  # XLEN in db 5
    assert lines[4] == b":0"  # db 0 is empty
    assert b"pw-1" not in data and b"reservation code" not in data
    assert r.headers["x-kvroute-worker"]


def test_precise_late_replica_warms_from_the_log(procs, tmp_path, sim_factory, kvroute):
    """precise: the workers keep only their last 2 event batches for replay, so a replica
    started late never hears of the blocks stored before (its replay is partial); the log's
    warm start tells it, and its first request goes where the old replica sent the
    conversation."""
    redis = Redis(procs, tmp_path)
    sims = []
    for _ in range(4):
        pub, rep = free_port(), free_port()
        s = sim_factory("--time-scale", "0", "--kv-events-bind", "bind",
                        "--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                        "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep,
                        "--kv-events-buffer-steps", "2")
        s.pub, s.rep = pub, rep
        sims.append(s)
    ev = []
    for s in sims:
        ev += ["--kv-events", "%s=tcp://127.0.0.1:%d,tcp://127.0.0.1:%d" % (s.url, s.pub, s.rep)]

    def states(kv):
        return [v for _, v in kv.metrics().find("kvroute_kv_events_state")]

    a = replica(kvroute, sims, redis, "a", policy="precise", extra=ev)
    wait_until(lambda: states(a) == [0, 0, 0, 0], 15.0, what="A's workers exact")
    convs = []
    for i in range(12):
        msgs = first_turn(i)
        r = chat(a, msgs)
        convs.append((msgs, reply_text(r), r.headers["x-kvroute-worker"]))
    assert len({w for _, _, w in convs}) >= 2
    wait_until(lambda: out_count(a) >= 24, 5.0, what="A wrote its entries")
    c = replica(kvroute, sims, redis, "c", policy="precise", extra=ev)
    wait_ready(c)
    wait_until(lambda: states(c) == [0, 0, 0, 0], 15.0, what="C's workers exact")
    msgs, reply, worker = convs[5]
    r = chat(c, next_turn(msgs, reply))
    assert r.headers["x-kvroute-worker"] == worker, r.headers
    assert float(r.headers["x-kvroute-match"]) >= 0.9, r.headers


def test_entries_wait_for_redis_within_the_queue_bound(procs, tmp_path, sim_factory, kvroute):
    """Redis away: entries queue up to --redis-queue-max (the rest are dropped and counted);
    when Redis answers they are written and another replica learns them."""
    port = free_port()
    sims = four_sims(sim_factory)[:2]
    a = kvroute(sims, model=SIM_MODEL, policy="cache_aware",
                extra=["--redis", "redis://127.0.0.1:%d" % port, "--replica-id", "a",
                       "--redis-queue-max", "4", "--redis-warm-timeout-ms", "0"])
    convs = []
    for i in range(5):  # two entries each (prompt, then prompt + reply)
        msgs = first_turn(i)
        r = chat(a, msgs)
        convs.append((msgs, reply_text(r), r.headers["x-kvroute-worker"]))
    assert metric(a, "kvroute_redis_errors_total", op="queue") == 6
    redis = Redis(procs, tmp_path, port=port)
    wait_until(lambda: out_count(a) == 4, 5.0, what="the 4 queued entries written")
    b = replica(kvroute, sims, redis, "b")
    wait_ready(b)
    assert metric(b, "kvroute_redis_log_entries_total", direction="in") == 4
    msgs, reply, worker = convs[1]  # entries 3 and 4: conversation 1 with its reply
    r = chat(b, next_turn(msgs, reply))
    assert r.headers["x-kvroute-worker"] == worker
    assert float(r.headers["x-kvroute-match"]) >= 0.9


def test_a_request_during_the_replay_waits_for_it(procs, tmp_path, sim_factory, kvroute):
    """A replica's first request sent as soon as it answers /healthz (not /readyz) still
    routes warm: it waits for the replay (bounded by --redis-warm-hold-ms)."""
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    # an older history to replay first: 20,000 entries of another replica
    import random
    import struct
    rnd = random.Random(5)
    buf = bytearray()
    for i in range(20000):
        keys = b"".join(struct.pack("<Q", rnd.getrandbits(64)) for _ in range(8))
        args = [b"XADD", b"kvroute:log", b"*", b"v", b"1", b"t", b"teach", b"r", b"old",
                b"w", sims[i % 4].url.encode(), b"ts", b"%d" % (time.time() * 1000), b"m",
                SIM_MODEL.encode(), b"bb", b"64", b"b", keys]
        buf += b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in args)
    with socket.create_connection(("127.0.0.1", redis.port), timeout=10.0) as sk:
        sk.sendall(bytes(buf))
        got = b""
        while got.count(b"\r\n") < 20000:
            got += sk.recv(1 << 20)
    a = replica(kvroute, sims, redis, "a")
    convs = []
    for i in range(40):
        msgs = first_turn(i)
        r = chat(a, msgs)
        convs.append((msgs, reply_text(r), r.headers["x-kvroute-worker"]))
    wait_until(lambda: out_count(a) >= 80, 5.0, what="A wrote its entries")
    for k in (3, 33):
        c = replica(kvroute, sims, redis, "c%d" % k)  # Kvroute waits for /healthz only
        msgs, reply, worker = convs[k]
        r = chat(c, next_turn(msgs, reply))
        assert r.headers["x-kvroute-worker"] == worker
        assert float(r.headers["x-kvroute-match"]) >= 0.9


def test_a_trimmed_gap_is_counted(procs, tmp_path, sim_factory, kvroute):
    """B falls behind (frozen) while the log is trimmed past its position: it counts the gap
    (errors{op="log_gap"}) once, and reads on from the oldest entry left."""
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)[:2]
    a = replica(kvroute, sims, redis, "a")
    b = replica(kvroute, sims, redis, "b")
    chat(a, first_turn(1))
    wait_applied(b, 2)

    def trim():
        with socket.create_connection(("127.0.0.1", redis.port), timeout=2.0) as s:
            s.sendall(b"XTRIM kvroute:log MAXLEN 0\r\n")
            assert s.recv(64).startswith(b":")

    b.proc.signal(signal.SIGSTOP)
    try:
        chat(a, first_turn(2))  # answers B's pending XREAD (unread while B is frozen)
        wait_until(lambda: out_count(a) >= 4, 5.0, what="A wrote")
        trim()
        chat(a, first_turn(3))  # B never sees these two entries
        wait_until(lambda: out_count(a) >= 6, 5.0, what="A wrote")
        trim()
        msgs = first_turn(4)
        r = chat(a, msgs)
        wait_until(lambda: out_count(a) >= 8, 5.0, what="A wrote after the trims")
    finally:
        b.proc.signal(signal.SIGCONT)
    wait_until(lambda: metric(b, "kvroute_redis_errors_total", op="log_gap") >= 1, 5.0,
               what="B counted the gap")
    r2 = chat(b, next_turn(msgs, reply_text(r)))
    assert r2.headers["x-kvroute-worker"] == r.headers["x-kvroute-worker"]
    assert float(r2.headers["x-kvroute-match"]) >= 0.9
    time.sleep(0.5)  # a few load polls: the same gap is counted once
    assert metric(b, "kvroute_redis_errors_total", op="log_gap") == 1


def cluster_status(kv):
    admin = "http://127.0.0.1:%s/cluster" % kv.argv[kv.argv.index("--admin-port") + 1]
    return httpx.get(admin, timeout=2.0, verify=SSL_CTX).json()


def test_two_live_replicas_with_one_replica_id_are_reported(procs, tmp_path, sim_factory,
                                                             kvroute):
    """Two processes given the same --replica-id would skip each other's routing-log entries
    as their own: both say so (metric, /cluster, an error line); a third with its own id does
    not, and neither does a replica restarted under its old id."""
    redis = Redis(procs, tmp_path)
    sims = four_sims(sim_factory)
    fast = ["--redis-load-interval-ms", "50"]
    slow = ["--redis-load-interval-ms", "1000"]  # its entry lives 3 s
    a1 = replica(kvroute, sims, redis, "a", extra=fast)
    b = replica(kvroute, sims, redis, "b", extra=slow)
    wait_until(lambda: any(r["id"] == "b" for r in cluster_status(a1)["replicas"]), 5.0,
               what="A sees B")
    # restarted under its id while its old entry lives: the first write finds the old
    # process's nonce, which is no conflict
    b.stop()
    b = replica(kvroute, sims, redis, "b", extra=slow)
    a2 = replica(kvroute, sims, redis, "a", extra=fast)
    for kv in (a1, a2):
        wait_until(lambda: metric(kv, "kvroute_cluster_replica_id_conflict") == 1, 5.0,
                   what="the --replica-id conflict reported")
        assert cluster_status(kv)["replica_id_conflict"] is True
        assert "another live kvroute publishes under this --replica-id" in kv.proc.stderr_text()
    time.sleep(2.2)  # B polled at least twice since its restart
    assert metric(b, "kvroute_cluster_replica_id_conflict") == 0
    assert cluster_status(b)["replica_id_conflict"] is False
    # the duplicate gone, the survivor's report clears after ten quiet intervals
    a2.stop()
    wait_until(lambda: metric(a1, "kvroute_cluster_replica_id_conflict") == 0, 5.0,
               what="the conflict over")
