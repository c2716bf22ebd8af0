-- wrk script for bench/overhead.sh: POSTs one fixed JSON chat request on every keep-alive
-- connection and prints one machine-readable result line at the end.
--   KVR_BENCH_BODY  file holding the request body (sent as is)
--   KVR_BENCH_MODE  "json" (default), "sse" (stub answers 20 events from one `return`) or
--                   "ssechunk" (stub answers the same events chunked, one flush per event)
local path = os.getenv("KVR_BENCH_BODY")
local f = assert(io.open(path, "rb"), "KVR_BENCH_BODY: cannot open " .. tostring(path))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
local mode = os.getenv("KVR_BENCH_MODE") or "json"
if mode ~= "json" then
    -- The stubs pick their answer by this header; kvroute and nginx forward it unchanged.
    wrk.headers["X-Bench-Mode"] = mode
    wrk.headers["Accept"] = "text/event-stream"
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "KVR_RESULT requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d p99_us=%d " ..
        "mean_us=%.1f max_us=%d err_connect=%d err_read=%d err_write=%d err_status=%d " ..
        "err_timeout=%d\n",
        summary.requests, summary.duration, summary.bytes,
        latency:percentile(50), latency:percentile(90), latency:percentile(99),
        latency.mean, latency.max,
        e.connect, e.read, e.write, e.status, e.timeout))
end
