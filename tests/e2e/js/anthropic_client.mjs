// The official Anthropic client against kvroute:
// `node anthropic_client.mjs <baseURL> [model] [apiKey] [badKey]`. baseURL is kvroute's root,
// e.g. http://127.0.0.1:8000 (a trailing /v1, as the openai client takes, is dropped: the SDK
// adds /v1/messages itself); model defaults to the first of GET /v1/models, apiKey to
// sk-kvroute-e2e (as openai_client.mjs). Prints one JSON object per step on stdout (models,
// message, stream, stream_helper, count_tokens, bad_key when badKey is given) and exits 0; on
// the first failure prints {"step": ..., "error": ...} and exits 1. No retries: the test wants
// to see the first answer.
import Anthropic from "@anthropic-ai/sdk";

const args = process.argv.slice(2);
if (!args[0]) {
  console.error("usage: node anthropic_client.mjs <baseURL> [model] [apiKey] [badKey]");
  process.exit(2);
}
const baseURL = args[0].replace(/\/+$/, "").replace(/\/v1$/, "");
const apiKey = args[2] || "sk-kvroute-e2e";
const badKey = args[3];
const opts = { baseURL, maxRetries: 0, timeout: 20000 };
const client = new Anthropic({ ...opts, apiKey });
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const system = "You are a terse assistant. Answer in one line.";
const routing = (h) => ({
  worker: h.get("x-kvroute-worker"),
  decision: h.get("x-kvroute-decision"),
  request_id: h.get("x-request-id"),
});
let step = "models";
try {
  let model = args[1];
  if (!model) {
    const r = await fetch(baseURL + "/v1/models", { headers: { "x-api-key": apiKey } });
    const ids = (await r.json()).data.map((m) => m.id);
    out({ step, ids });
    model = ids[0];
  }

  step = "message";
  const { data: msg, response } = await client.messages
    .create({ model, max_tokens: 8, system, messages: [{ role: "user", content: "Say hello" }] })
    .withResponse();
  out({
    step,
    id: msg.id,
    type: msg.type,
    model: msg.model,
    text: msg.content.map((b) => (b.type === "text" ? b.text : "")).join(""),
    stop_reason: msg.stop_reason,
    usage: msg.usage,
    ...routing(response.headers),
  });

  step = "stream";
  const { data: stream, response: sresp } = await client.messages
    .create({
      model,
      max_tokens: 8,
      system,
      messages: [{ role: "user", content: "Count to three" }],
      stream: true,
    })
    .withResponse();
  const events = [];
  let text = "";
  let usage = null;
  let stop = null;
  for await (const ev of stream) {
    events.push(ev.type);
    if (ev.type === "message_start") usage = { ...ev.message.usage };
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
    if (ev.type === "message_delta") {
      stop = ev.delta.stop_reason;
      usage = { ...usage, output_tokens: ev.usage.output_tokens };
    }
  }
  out({ step, events, text, usage, stop_reason: stop, ...routing(sresp.headers) });

  step = "stream_helper";
  const helper = client.messages.stream({
    model,
    max_tokens: 6,
    system,
    messages: [{ role: "user", content: "Count to three" }],
  });
  let helperText = "";
  helper.on("text", (t) => (helperText += t));
  const final = await helper.finalMessage();
  out({
    step,
    text: helperText,
    final_text: final.content.map((b) => (b.type === "text" ? b.text : "")).join(""),
    usage: final.usage,
    stop_reason: final.stop_reason,
  });

  step = "count_tokens";
  const count = await client.messages.countTokens({
    model,
    system,
    messages: [{ role: "user", content: "Say hello" }],
  });
  out({ step, input_tokens: count.input_tokens });

  if (badKey) {
    step = "bad_key";
    const bad = new Anthropic({ ...opts, apiKey: badKey });
    try {
      await bad.messages.create({
        model,
        max_tokens: 4,
        messages: [{ role: "user", content: "hi" }],
      });
      out({ step, error: "a wrong key was accepted" });
      process.exit(1);
    } catch (e) {
      if (!(e instanceof Anthropic.APIError)) throw e;
      out({
        step,
        status: e.status,
        class: e.constructor.name,
        error_type: e.error?.error?.type ?? null,
        body_type: e.error?.type ?? null,
      });
    }
  }
} catch (e) {
  out({ step, error: String(e && e.message ? e.message : e), status: e?.status ?? null });
  process.exit(1);
}
