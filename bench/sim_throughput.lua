-- wrk script for bench/sim_throughput.sh: POSTs an ~8 KB chat prompt to kvroute-sim.
-- MODE=shared: every prompt shares the same 8 KB head and ends with a unique line (a hot
--              system prompt: mostly prefix-cache hits).
-- MODE=unique: the unique line comes first, so nothing is ever cached (every block is
--              computed, cached and later evicted: the engine's most expensive path).
local mode = os.getenv("MODE") or "shared"
local bytes = tonumber(os.getenv("PROMPT_BYTES") or "8192")
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "16")
local stream = os.getenv("STREAM") == "1"  -- SSE with a usage chunk instead of one JSON body
local words = {"the", "router", "sends", "each", "request", "to", "a", "worker", "that",
               "holds", "its", "prefix", "in", "cache", "and", "keeps", "sessions", "sticky"}
local parts, n, i = {}, 0, 0
while n < bytes do
  local w = words[(i * 7) % #words + 1]
  parts[#parts + 1] = w
  n = n + #w + 1
  i = i + 1
end
local body_text = table.concat(parts, " ")
local counter = 0
local thread_id = 0

function setup(thread)
  thread:set("thread_id", thread_id)
  thread_id = thread_id + 1
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function request()
  counter = counter + 1
  local tag = "request " .. thread_id .. "-" .. counter .. "."
  local content
  if mode == "unique" then
    content = tag .. " " .. body_text
  else
    content = body_text .. " " .. tag
  end
  local body = '{"model":"sim","max_tokens":' .. max_tokens ..
      (stream and ',"stream":true,"stream_options":{"include_usage":true}' or '') ..
      ',"messages":[{"role":"system","content":"You are a helpful assistant."},' ..
      '{"role":"user","content":"' .. content .. '"}]}'
  return wrk.format(nil, nil, nil, body)
end

local errors = 0
function response(status, headers, body)
  if status ~= 200 then
    errors = errors + 1
    if errors <= 3 then io.stderr:write("status " .. status .. ": " .. body .. "\n") end
  end
end
