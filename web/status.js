// kvroute status page: renders GET /status every 2 s. Everything comes from that one JSON
// endpoint on the admin port; nothing is fetched from anywhere else. With --admin-token-file,
// the page asks for the token once and keeps it in sessionStorage (also taken from a
// "#token=..." fragment, which is then removed from the address bar).
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "kvroute-admin-token";

(function takeTokenFromFragment() {
  const m = /^#token=(.+)$/.exec(location.hash);
  if (m) {
    try {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    } catch (e) {
      /* a malformed #token=: ignored, the page asks for the token */
    }
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

const $ = (id) => document.getElementById(id);

// Counts are shown as /status gives them: unabbreviated, no separators.
function count(v) { return v === null || v === undefined ? "—" : String(v); }
function percent(v, digits) { return v === null || v === undefined ? "—" : (v * 100).toFixed(digits) + "%"; }
function ms(v) { return v === null || v === undefined ? "—" : v.toFixed(1) + " ms"; }

function setText(id, text, raw) {
  const el = $(id);
  el.textContent = text;
  if (raw !== undefined) el.dataset.value = raw === null ? "" : String(raw);
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) {
    if (k.startsWith("data-")) e.setAttribute(k, attrs[k]);
    else e[k] = attrs[k];
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

function badge(text, cls) { return el("span", { className: "badge " + cls }, text); }

function renderTrend(points) {
  const svg = $("trend");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const n = points.length || 1, w = 300 / n;
  points.forEach((p, i) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = p.hit_rate === null ? 2 : Math.max(2, p.hit_rate * 58);
    r.setAttribute("x", String(i * w + 1));
    r.setAttribute("width", String(Math.max(1, w - 2)));
    r.setAttribute("y", String(60 - h));
    r.setAttribute("height", String(h));
    if (p.hit_rate === null) r.setAttribute("class", "empty");
    r.setAttribute("data-hit-rate", p.hit_rate === null ? "" : String(p.hit_rate));
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = new Date(p.time * 1000).toLocaleTimeString() + ": " +
      (p.hit_rate === null ? "no tokens" : percent(p.hit_rate, 1) + " of " + count(p.prompt_tokens) + " prompt tokens");
    r.appendChild(t);
    svg.appendChild(r);
  });
}

function renderDecisions(dec) {
  const body = $("decisions").tBodies[0];
  body.replaceChildren();
  const rows = Object.entries(dec).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  if (!rows.length) body.appendChild(el("tr", {}, "")).appendChild(el("td", { colSpan: 2, className: "muted" }, "no requests routed yet"));
  for (const [label, n] of rows) {
    const tr = el("tr", { "data-decision": label });
    tr.appendChild(el("td", {}, label));
    tr.appendChild(el("td", { className: "num", "data-field": "decisions." + label }, count(n)));
    body.appendChild(tr);
  }
}

function renderRoutes(routes) {
  const box = $("routes");
  box.replaceChildren();
  routes.forEach((rt, ri) => {
    const card = el("section", { className: "card wide", "data-route": rt.name });
    const h = el("h3", {}, "Route " + rt.name + " ");
    h.appendChild(el("span", { className: "muted" }, "(" + rt.policy + ")"));
    card.appendChild(h);
    const table = el("table");
    const head = el("tr");
    for (const c of ["worker", "state", "in flight", "queue", "KV usage", "index blocks", "sessions"])
      head.appendChild(el("th", { className: c === "worker" || c === "state" ? "" : "num" }, c));
    table.appendChild(el("thead")).appendChild(head);
    const body = el("tbody");
    rt.workers.forEach((w, wi) => {
      const p = "routes." + ri + ".workers." + wi + ".";
      const tr = el("tr", { "data-worker": w.url });
      const name = el("td");
      name.appendChild(el("div", { "data-field": p + "name" }, w.name));
      name.appendChild(el("div", { className: "url muted", "data-field": p + "url" }, w.url));
      tr.appendChild(name);
      const st = el("td");
      st.appendChild(badge(w.eligible ? "eligible" : "not eligible", w.eligible ? "good" : "bad"));
      st.appendChild(badge(w.healthy ? "healthy" : "unhealthy", w.healthy ? "good" : "bad"));
      st.appendChild(badge("breaker " + w.breaker, w.breaker === "closed" ? "good" : w.breaker === "open" ? "bad" : "warn"));
      if (w.draining) st.appendChild(badge("draining", "warn"));
      tr.appendChild(st);
      tr.appendChild(el("td", { className: "num", "data-field": p + "inflight" }, count(w.inflight)));
      tr.appendChild(el("td", { className: "num", "data-field": p + "queue" }, count(w.queue)));
      tr.appendChild(el("td", { className: "num", "data-field": p + "kv_usage" }, percent(w.kv_usage, 1)));
      tr.appendChild(el("td", { className: "num", "data-field": p + "index_blocks" }, count(w.index_blocks)));
      tr.appendChild(el("td", { className: "num", "data-field": p + "sessions" }, count(w.sessions)));
      body.appendChild(tr);
    });
    table.appendChild(body);
    card.appendChild(table);
    box.appendChild(card);
  });
}

function render(s) {
  setText("hit_rate", percent(s.hit_rate, 1), s.hit_rate);
  setText("prompt_tokens", count(s.prompt_tokens), s.prompt_tokens);
  setText("cached_tokens", count(s.cached_tokens), s.cached_tokens);
  setText("requests_per_s", s.requests_per_s.toFixed(2), s.requests_per_s);
  setText("error_rate", percent(s.error_rate, 2), s.error_rate);
  setText("ttft_p50", ms(s.ttft_ms.p50), s.ttft_ms.p50);
  setText("ttft_p99", ms(s.ttft_ms.p99), s.ttft_ms.p99);
  setText("ttft_samples", count(s.ttft_ms.samples), s.ttft_ms.samples);
  renderTrend(s.hit_rate_trend);
  renderDecisions(s.decisions);
  renderRoutes(s.routes);
  $("login").hidden = true;
  $("content").hidden = false;
  setState("live", "good");
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  document.body.dataset.state = "ok";
}

function setState(text, cls) {
  const e = $("state");
  e.textContent = text;
  e.className = "state " + (cls || "bad");
}

function askToken(message) {
  $("content").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  setState("admin token needed", "warn");
  document.body.dataset.state = "token";
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: "Bearer " + token } : {};
  try {
    new Headers(headers); // a token with characters HTTP headers cannot carry
  } catch (e) {
    askToken("that token cannot be sent (HTTP headers carry only Latin-1 characters)");
    return;
  }
  try {
    const r = await fetch("/status", { headers, cache: "no-store" });
    if (r.status === 401) {
      askToken(token ? "that token was refused" : "");
      return; // wait for the form
    }
    if (!r.ok) throw new Error("GET /status answered " + r.status);
    render(await r.json());
  } catch (e) {
    setState("kvroute unreachable (" + e.message + ")");
    document.body.dataset.state = "error";
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
  $("token-input").value = "";
  refresh();
});

refresh();
