// A real OpenAI client against kvroute: `node openai_client.mjs <baseURL> [model]`.
// baseURL is kvroute's "/v1" root, e.g. http://127.0.0.1:8000/v1. Prints one JSON object per
// step on stdout (models, chat, stream) and exits 0; on the first failure prints
// {"step": ..., "error": ...} and exits 1. No retries: the test wants to see the first answer.
import OpenAI from "openai";

const baseURL = process.argv[2];
const wantModel = process.argv[3];
if (!baseURL) {
  console.error("usage: node openai_client.mjs <baseURL> [model]");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: "sk-kvroute-e2e", maxRetries: 0, timeout: 20000 });
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
let step = "models";
try {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  out({ step, ids });
  const model = wantModel || ids[0];

  step = "chat";
  const { data: chat, response } = await client.chat.completions
    .create({ model, messages: [{ role: "user", content: "Say hello" }], max_tokens: 8 })
    .withResponse();
  out({
    step,
    id: chat.id,
    model: chat.model,
    content: chat.choices[0].message.content,
    finish_reason: chat.choices[0].finish_reason,
    usage: chat.usage,
    worker: response.headers.get("x-kvroute-worker"),
    decision: response.headers.get("x-kvroute-decision"),
    request_id: response.headers.get("x-request-id"),
  });

  step = "stream";
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Count" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = "";
  let chunks = 0;
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.choices && chunk.choices.length) {
      content += chunk.choices[0].delta?.content ?? "";
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  out({ step, content, chunks, usage, finish_reason: finish });
} catch (e) {
  out({ step, error: String(e && e.message ? e.message : e), status: e?.status ?? null });
  process.exit(1);
}
