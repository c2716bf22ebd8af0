"""The status page on the admin port (GET /, its CSS and JavaScript, GET /status), the access
log (--access-log, SIGUSR1 reopen) and the Grafana dashboard's metrics.

Real processes on 127.0.0.1: kvroute over two kvroute-sim workers (or stub workers), and
headless Chromium (Debian's `chromium`) loading the page, which must show the numbers
/status gives. Every wait is bounded. Without chromium the browser test skips, except in CI
(CI=true), where it fails. KVROUTE_STATUS_SCREENSHOT=PATH also saves a screenshot there."""
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import (KVROUTE_BIN, MODEL, REPO, SIM_MODEL, SSL_CTX, Proc, free_port,
                      wait_until)

TOKEN = "status-Token.17"
STATUS_WORKER_FIELDS = {"name", "url", "eligible", "healthy", "breaker", "draining", "inflight",
                        "queue", "kv_usage", "index_blocks", "sessions"}
ACCESS_FIELDS = ["time", "request_id", "route", "worker", "decision", "match", "attempts",
                 "status", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms",
                 "total_ms", "client", "key"]


def admin_get(port, path, token=None, timeout=5.0):
    h = {"authorization": "Bearer " + token} if token else {}
    return httpx.get("http://127.0.0.1:%d%s" % (port, path), headers=h, timeout=timeout,
                     verify=SSL_CTX)


def start_fleet(sim_factory, kvroute, tmp_path, extra=(), token=TOKEN):
    sims = [sim_factory("--time-scale", "0"), sim_factory("--time-scale", "0")]
    admin = free_port()
    args = ["--admin-port", admin, "--scrape-interval", "1"] + list(extra)
    if token:
        f = tmp_path / "admin-token"
        f.write_text(token + "\n")
        args += ["--admin-token-file", str(f)]
    kv = kvroute(sims, model=SIM_MODEL, policy="cache_aware", extra=args)
    return sims, kv, admin


def traffic(kv, n=12, stream_every=0):
    """Multi-turn chats over a few sessions (they hit the caches), some streamed."""
    for i in range(n):
        body = {"model": SIM_MODEL, "max_tokens": 8, "messages": [
            {"role": "system", "content": "You are a careful assistant. " * 8},
            {"role": "user", "content": "conversation %d: what is in my order?" % (i % 3)}]}
        if stream_every and i % stream_every == 0:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        r = kv.post("/v1/chat/completions", body, headers={"x-session-id": "s%d" % (i % 3)})
        assert r.status_code == 200, r.text


def metric_sum(m, name, by=None):
    out = {}
    for labels, v in m.find(name):
        k = labels.get(by) if by else None
        out[k] = out.get(k, 0) + v
    return out if by else out.get(None, 0)


# ============================================================================ /status
def test_status_fields_match_metrics_and_token_guards_it(sim_factory, kvroute, tmp_path):
    sims, kv, admin = start_fleet(sim_factory, kvroute, tmp_path)
    # the page and its files: no token needed, embedded, no external references
    for path, ctype in (("/", "text/html"), ("/status.css", "text/css"),
                        ("/status.js", "text/javascript")):
        r = admin_get(admin, path)
        assert r.status_code == 200, (path, r.status_code)
        assert r.headers["content-type"].startswith(ctype), r.headers
        assert "default-src 'self'" in r.headers.get("content-security-policy", "")
        assert not re.search(r"(src|href)=\"(https?:)?//", r.text), "external reference in " + path
        text = r.text.replace("http://www.w3.org/2000/svg", "")  # a namespace, not a fetch
        assert "http://" not in text and "https://" not in text, path
    page = admin_get(admin, "/").text
    assert "/status.js" in page and "/status.css" in page
    # /status and every other admin path need the token
    for path in ("/status", "/workers", "/routes", "/nope"):
        r = admin_get(admin, path)
        assert r.status_code == 401, (path, r.status_code)
        assert admin_get(admin, path, "wrong").status_code == 401
    r = admin_get(admin, "/status", TOKEN)
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["prompt_tokens"] == 0 and s["hit_rate"] == 0 and s["decisions"] == {}
    assert s["ttft_ms"]["p50"] is None and s["ttft_ms"]["p99"] is None

    traffic(kv, n=12, stream_every=4)
    assert kv.post("/v1/chat/completions", content=b"{bad").status_code == 400
    kv.wait_inflight_zero()
    s = admin_get(admin, "/status", TOKEN).json()
    m = kv.metrics()
    for k in ("routes", "hit_rate", "prompt_tokens", "cached_tokens", "hit_rate_trend",
              "decisions", "requests_per_s", "error_rate", "ttft_ms"):
        assert k in s, k
    assert [r["name"] for r in s["routes"]] == [SIM_MODEL]
    ws = s["routes"][0]["workers"]
    assert sorted(w["url"] for w in ws) == sorted(x.url for x in sims)
    for w in ws:
        assert STATUS_WORKER_FIELDS <= set(w), w
        assert w["eligible"] is True and w["healthy"] is True and w["draining"] is False
        assert w["breaker"] == "closed" and w["inflight"] == 0
        assert isinstance(w["index_blocks"], int) and isinstance(w["sessions"], int)
    assert sum(w["sessions"] for w in ws) == 3
    # the same counts as /metrics
    assert s["prompt_tokens"] == metric_sum(m, "kvroute_prompt_tokens_total") > 0
    assert s["cached_tokens"] == metric_sum(m, "kvroute_cached_tokens_total") > 0
    assert abs(s["hit_rate"] - s["cached_tokens"] / s["prompt_tokens"]) < 1e-9
    assert 0 < s["hit_rate"] <= 1
    dec = {k: int(v) for k, v in metric_sum(m, "kvroute_decisions_total", "decision").items()}
    assert s["decisions"] == dec and sum(dec.values()) == 12
    assert s["requests_per_s"] > 0 and s["error_rate"] == 0
    assert s["ttft_ms"]["samples"] == 12
    assert 0 <= s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"]
    trend = s["hit_rate_trend"]
    assert len(trend) == 30
    assert [p["time"] for p in trend] == sorted(p["time"] for p in trend)
    assert trend[-1]["time"] - trend[0]["time"] == 29 * 30
    assert sum(p["prompt_tokens"] for p in trend) == s["prompt_tokens"]
    assert any(p["hit_rate"] is not None for p in trend)
    # kv_usage and queue come from the workers' scraped metrics (every second here)
    wait_until(lambda: all(w["kv_usage"] is not None and w["queue"] is not None
                           for w in admin_get(admin, "/status", TOKEN).json()["routes"][0]["workers"]),
               5.0, 0.1, "scraped kv_usage and queue")
    # a drained worker shows it
    name = ws[0]["name"]
    r = httpx.post("http://127.0.0.1:%d/workers/%s/drain" % (admin, name), timeout=5.0,
                   headers={"authorization": "Bearer " + TOKEN}, verify=SSL_CTX)
    assert r.status_code == 200, r.text
    w0 = [w for w in admin_get(admin, "/status", TOKEN).json()["routes"][0]["workers"]
          if w["name"] == name][0]
    assert w0["draining"] is True and w0["eligible"] is False


# ============================================================================ the page in a browser
class Fields(html.parser.HTMLParser):
    """data-field → text, from a dumped DOM; and the body's data-state."""

    def __init__(self):
        super().__init__()
        self.fields, self.stack, self.state = {}, [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.state = a.get("data-state")
        if tag in ("br", "meta", "link", "input", "rect"):
            return
        self.stack.append([a.get("data-field"), ""])

    def handle_endtag(self, tag):
        if tag in ("br", "meta", "link", "input", "rect") or not self.stack:
            return
        field, text = self.stack.pop()
        if self.stack:
            self.stack[-1][1] += text
        if field:
            self.fields[field] = text.strip()

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][1] += data


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        msg = "chromium is not installed (scripts/install-deps.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def run_chromium(exe, url, *args, timeout=60):
    with tempfile.TemporaryDirectory(prefix="kvr-chromium-") as profile:
        argv = [exe, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-dev-shm-usage", "--user-data-dir=" + profile,
                "--virtual-time-budget=4000"]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")  # Chromium refuses root without it
        argv += list(args) + [url]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p


def test_status_page_in_headless_chromium_shows_status(sim_factory, kvroute, tmp_path):
    exe = chromium()
    sims, kv, admin = start_fleet(sim_factory, kvroute, tmp_path)
    traffic(kv, n=15, stream_every=5)
    kv.wait_inflight_zero()
    wait_until(lambda: all(w["kv_usage"] is not None for w in
                           admin_get(admin, "/status", TOKEN).json()["routes"][0]["workers"]),
               5.0, 0.1, "scraped kv_usage")
    base = "http://127.0.0.1:%d/" % admin
    # without the token the page asks for it (and shows no data)
    p = run_chromium(exe, base, "--dump-dom")
    assert p.returncode == 0, p.stderr[-2000:]
    f = Fields()
    f.feed(p.stdout.decode("utf-8", "replace"))
    assert f.state == "token", p.stdout[-2000:]
    # with it (the page takes it from the fragment into sessionStorage) it renders /status
    p = run_chromium(exe, base + "#token=" + TOKEN, "--dump-dom")
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout.decode("utf-8", "replace")
    f = Fields()
    f.feed(dom)
    assert f.state == "ok", dom[-3000:]
    s = admin_get(admin, "/status", TOKEN).json()  # no traffic since: counts are the same
    assert f.fields["prompt_tokens"] == str(s["prompt_tokens"])
    assert f.fields["cached_tokens"] == str(s["cached_tokens"])
    assert f.fields["hit_rate"] == "%.1f%%" % (s["hit_rate"] * 100)
    assert f.fields["error_rate"] == "%.2f%%" % (s["error_rate"] * 100)
    assert f.fields["ttft_ms.samples"] == str(s["ttft_ms"]["samples"])
    assert f.fields["ttft_ms.p50"] == "%.1f ms" % s["ttft_ms"]["p50"]
    assert f.fields["ttft_ms.p99"] == "%.1f ms" % s["ttft_ms"]["p99"]
    assert s["decisions"]
    for label, n in s["decisions"].items():
        assert f.fields["decisions." + label] == str(n)
    for ri, rt in enumerate(s["routes"]):
        for wi, w in enumerate(rt["workers"]):
            p_ = "routes.%d.workers.%d." % (ri, wi)
            assert f.fields[p_ + "url"] == w["url"]
            assert f.fields[p_ + "name"] == w["name"]
            for k in ("inflight", "queue", "index_blocks", "sessions"):
                assert f.fields[p_ + k] == str(w[k]), (k, f.fields[p_ + k], w[k])
            assert f.fields[p_ + "kv_usage"] == "%.1f%%" % (w["kv_usage"] * 100)
    assert 'data-decision="' in dom and "<rect" in dom  # decisions table and trend bars
    shot = os.environ.get("KVROUTE_STATUS_SCREENSHOT")
    if shot:
        p = run_chromium(exe, base + "#token=" + TOKEN, "--hide-scrollbars",
                         "--window-size=1200,1000", "--screenshot=" + str(Path(shot).resolve()))
        assert p.returncode == 0, p.stderr[-2000:]


# ============================================================================ access log
def read_lines(path, n, timeout=5.0):
    def got():
        try:
            lines = Path(path).read_text().splitlines()
        except FileNotFoundError:
            return None
        return lines if len(lines) >= n else None
    lines = wait_until(got, timeout, 0.02, "%d access-log lines in %s" % (n, path))
    return [json.loads(x) for x in lines]


def test_access_log_lines_and_reopen_on_sigusr1(stub, kvroute, tmp_path):
    log = tmp_path / "access.log"
    keys = tmp_path / "keys"
    keys.write_text("team-a:sk-secret-a\n")
    w = stub()
    kv = kvroute([w], extra=["--access-log", str(log), "--api-key-file", str(keys)])
    auth = {"authorization": "Bearer sk-secret-a"}
    r = kv.post("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "hello"}]}, headers=dict(auth, **{"x-request-id": "rid-1"}))
    assert r.status_code == 200, r.text
    r = kv.post("/v1/chat/completions", {"model": MODEL, "stream": True, "messages": [
        {"role": "user", "content": "hello"}]}, headers=auth)
    assert r.status_code == 200, r.text
    assert kv.post("/v1/chat/completions", {"model": MODEL, "messages": []}).status_code == 401
    assert kv.post("/v1/chat/completions", content=b"{bad", headers=auth).status_code == 400
    assert kv.get("/v1/nope", headers=auth).status_code == 404
    lines = read_lines(log, 5)
    text = log.read_text()
    assert "sk-secret-a" not in text, "the key itself was logged"
    for ln in lines:
        assert list(ln) == ACCESS_FIELDS, ln
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", ln["time"]), ln
        assert ln["client"] == "127.0.0.1"
        assert ln["total_ms"] >= 0
    ok, st, unauth, bad, nf = lines
    assert ok["request_id"] == "rid-1"
    assert ok["route"] == MODEL and ok["worker"] == w.url and ok["status"] == 200
    assert ok["decision"] and ok["attempts"] == 1 and ok["key"] == "team-a"
    assert ok["ttft_ms"] is not None and 0 <= ok["ttft_ms"] <= ok["total_ms"]
    for k in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        assert isinstance(ok[k], int), (k, ok)
    assert st["status"] == 200 and st["ttft_ms"] is not None and st["key"] == "team-a"
    assert st["request_id"] == r.headers["x-request-id"]
    assert (unauth["status"], unauth["key"], unauth["route"], unauth["worker"]) == (401, None, None, None)
    assert (bad["status"], bad["key"], bad["attempts"]) == (400, "team-a", 0)
    assert nf["status"] == 404
    # kvroute's own log stays on stderr, never in the access log
    assert "listening" in kv.proc.stderr_text() and "listening" not in text

    # rotation: rename, SIGUSR1, the next lines go to a new file under the old name
    rotated = tmp_path / "access.log.1"
    log.rename(rotated)
    kv.proc.signal(signal.SIGUSR1)
    wait_until(lambda: "access log reopened" in kv.proc.stderr_text(), 5.0, 0.02, "reopen")
    assert kv.post("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "after"}]}, headers=auth).status_code == 200
    new = read_lines(log, 1)
    assert len(new) == 1 and new[0]["status"] == 200
    assert len(rotated.read_text().splitlines()) == 5


def test_access_log_is_off_by_default_and_bad_path_refuses_to_start(stub, kvroute, tmp_path):
    w = stub()
    kv = kvroute([w])
    assert kv.chat().status_code == 200
    assert "access-log" not in " ".join(kv.argv)
    bad = kvroute([w], extra=["--access-log", str(tmp_path / "no" / "dir" / "a.log")],
                  wait_ready=False)
    wait_until(lambda: not bad.proc.alive(), 5.0, 0.05, "kvroute to refuse the path")
    assert bad.proc.returncode() != 0
    assert "--access-log" in bad.proc.stderr_text()


def test_access_log_dash_writes_to_stdout(stub, procs, tmp_path):
    if not KVROUTE_BIN.exists():
        pytest.skip("kvroute binary not built")
    w = stub()
    port = free_port()
    out = open(tmp_path / "stdout", "wb")
    try:
        p = Proc([str(KVROUTE_BIN), "--worker", w.url, "--model", MODEL, "--host", "127.0.0.1",
                  "--port", str(port), "--access-log", "-"], tmp_path / "kvroute-dash.stderr",
                 stdout=out)
    finally:
        out.close()
    procs.procs.append(p)
    url = "http://127.0.0.1:%d" % port

    def ready():
        return httpx.get(url + "/healthz", timeout=1.0, verify=SSL_CTX).status_code == 200
    wait_until(ready, 10.0, 0.05, "kvroute ready")
    r = httpx.post(url + "/v1/chat/completions", timeout=5.0, verify=SSL_CTX, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    lines = read_lines(tmp_path / "stdout", 1)
    assert len(lines) == 1 and list(lines[0]) == ACCESS_FIELDS
    assert lines[0]["request_id"] == r.headers["x-request-id"] and lines[0]["key"] is None
    assert "listening" in p.stderr_text()  # kvroute's own log: stderr


# ============================================================================ Grafana
def dashboard_metrics():
    d = json.loads((REPO / "docs" / "grafana" / "kvroute.json").read_text())
    exprs = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(d)
    names = set()
    for e in exprs:
        names.update(re.findall(r"\b(kvroute_[a-z0-9_]+)", e))
    return d, exprs, names


def family_of(name, types):
    """The metric family a queried series belongs to (a histogram's _bucket/_sum/_count)."""
    if name in types:
        return name
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base if types.get(base) == "histogram" else None


def test_grafana_dashboard_queries_only_metrics_kvroute_exports(stub, kvroute):
    d, exprs, names = dashboard_metrics()
    assert d["title"] and d["panels"] and exprs
    # importable as it is: the datasource is a variable, no import-time inputs are needed
    assert "__inputs" not in d
    assert any(v["type"] == "datasource" for v in d["templating"]["list"])
    for want in ("kvroute_cached_tokens_total", "kvroute_prompt_tokens_total",
                 "kvroute_decisions_total", "kvroute_worker_inflight",
                 "kvroute_ttft_seconds_bucket",
                 "kvroute_retries_total", "kvroute_worker_breaker_state", "kvroute_worker_queue",
                 "kvroute_upstream_errors_total"):
        assert want in names, want
    kv = kvroute([stub()])  # plain: --worker URL --model NAME, no feature turned on
    m = kv.metrics()
    helps = {ln.split()[2] for ln in m.text.splitlines() if ln.startswith("# HELP ")}
    for n in sorted(names):
        fam = family_of(n, m.types)
        assert fam, "the dashboard queries %s, which /metrics does not have" % n
        assert fam in helps, "%s has no HELP" % fam
