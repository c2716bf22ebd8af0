"""The official openai npm client (openai@6, pinned by tests/e2e/js/package-lock.json) as a real
client of kvroute: list models, a plain chat completion, a streamed one with
stream_options.include_usage."""
import json
import shutil
import subprocess

import pytest

from conftest import E2E_DIR, MODEL

JS = E2E_DIR / "js"


def test_openai_node_client(stub, kvroute):
    node = shutil.which("node")
    assert node, "node not installed (scripts/install-deps.sh installs nodejs)"
    assert (JS / "node_modules" / "openai").is_dir(), \
        "openai npm package not installed: run scripts/install-deps.sh (npm ci in tests/e2e/js)"
    w = stub()
    kv = kvroute([w], policy="round_robin", health_interval_ms=0)
    try:
        p = subprocess.run([node, str(JS / "openai_client.mjs"), kv.url + "/v1", MODEL],
                           cwd=str(JS), capture_output=True, timeout=60, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("openai client did not finish within 60 s")
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    steps = {o["step"]: o for o in lines}
    assert p.returncode == 0, "openai client failed: %r; stderr: %s" % (lines[-1:] , p.stderr[-2000:])

    assert MODEL in steps["models"]["ids"], steps["models"]

    chat = steps["chat"]
    assert chat["content"] == "tok0 tok1 tok2 tok3 tok4 ", chat
    assert chat["finish_reason"] == "stop"
    assert chat["usage"]["completion_tokens"] == 5
    assert chat["worker"] == w.url and chat["decision"] == "round_robin" and chat["request_id"], chat

    st = steps["stream"]
    assert st["content"] == "tok0 tok1 tok2 tok3 tok4 ", st
    assert st["finish_reason"] == "stop"
    assert st["usage"] and st["usage"]["completion_tokens"] == 5, "no usage chunk: %r" % st

    reqs = w.proxied()
    assert len(reqs) == 2, [e["path"] for e in reqs]
    assert reqs[1]["stream"] is True
    ua = [v for k, v in reqs[0]["headers"] if k.lower() == "authorization"]
    assert ua == [], "client's Authorization forwarded to the worker: %r" % ua
