-- wrk script: GET /sync/v1/events for one user.
-- BENCH_TOKEN: the user's access token. BENCH_LIMIT: page size (default 1000).
-- BENCH_AFTER_MAX: cursors are drawn uniformly from 0..BENCH_AFTER_MAX; BENCH_AFTER fixes
-- the cursor instead (the empty pull uses the last seq).

function init(args)
  token = os.getenv("BENCH_TOKEN")
  limit = os.getenv("BENCH_LIMIT") or "1000"
  fixed = os.getenv("BENCH_AFTER")
  max_after = tonumber(os.getenv("BENCH_AFTER_MAX") or "0")
  wrk.headers["Authorization"] = "Bearer " .. token
  math.randomseed(os.time() + math.floor(os.clock() * 1000000))
  if fixed then
    fixed_request = wrk.format("GET", "/sync/v1/events?after=" .. fixed .. "&limit=" .. limit)
  end
end

function request()
  if fixed_request then return fixed_request end
  return wrk.format("GET", "/sync/v1/events?after=" .. math.random(0, max_after) .. "&limit=" .. limit)
end

-- BENCH_DELAY_MS: pause before each request of a connection (the latency measurement runs
-- at a fixed rate, half the maximum: run.sh computes it).
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if pause > 0 then
  -- Exponentially distributed with that mean (Poisson arrivals, as pgbench --rate): fixed
  -- pauses would keep the connections in lockstep, every request of a round arriving at once.
  function delay() return math.floor(-math.log(1 - math.random()) * pause + 0.5) end
end
