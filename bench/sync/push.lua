-- wrk script: POST /sync/v1/events with 100 new events per request.
-- Run with as many threads as connections (-tN -cN): each thread then owns one connection
-- and pushes for its own users only, so two connections never wait on the same user's row
-- lock (different users never contend; one user's devices rarely push at the same time).
-- BENCH_TOKENS: file with one access token per line (one per user).
-- BENCH_EVENTS: events per request (default 100).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local function read_tokens(path)
  local tokens = {}
  for line in io.lines(path) do
    if #line > 0 then table.insert(tokens, line) end
  end
  return tokens
end

function init(args)
  local all = read_tokens(os.getenv("BENCH_TOKENS"))
  local connections = tonumber(os.getenv("BENCH_CONNECTIONS"))
  per_request = tonumber(os.getenv("BENCH_EVENTS") or "100")
  -- This thread's users: id, id + connections, id + 2 * connections, ...
  mine = {}
  for index = id + 1, #all, connections do table.insert(mine, all[index]) end
  -- Random version-4 client ids, as apps make them (Swift's UUID(), crypto.randomUUID()):
  -- inserts land all over the (user_id, client_id) index, as the ceiling's
  -- gen_random_uuid() do. (Until session 8 they were a run prefix and a counter: each
  -- connection's inserts stayed at one end of the index, cheaper than the ceiling's, so
  -- the ratio grew with every round as the ceiling's table did.)
  math.randomseed(os.time() * 7919 + id * 104729 + math.floor(os.clock() * 1000000))
  sent = 0
  turn = 0
  payload = '{"plant":"fern","bed":3,"x":12.5,"y":7,"tags":["shade","wet"],"note":"watered after the rain"}'
end

function request()
  turn = turn + 1
  local token = mine[(turn - 1) % #mine + 1]
  local parts = {}
  for i = 1, per_request do
    sent = sent + 1
    parts[i] = string.format(
      '{"client_id":"%08x-%04x-4%03x-%04x-%06x%06x","type":"sprout_planted","payload":%s,"client_timestamp":"2026-11-22T04:10:02.123Z"}',
      math.random(0, 0xffffffff), math.random(0, 0xffff), math.random(0, 0xfff), math.random(0x8000, 0xbfff),
      math.random(0, 0xffffff), math.random(0, 0xffffff), payload)
  end
  local body = '{"events":[' .. table.concat(parts, ",") .. ']}'
  return wrk.format("POST", "/sync/v1/events",
    { ["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json" }, body)
end

-- BENCH_DELAY_MS: pause before each request of a connection (the latency measurement runs
-- at a fixed rate, half the maximum: run.sh computes it).
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if pause > 0 then
  -- Exponentially distributed with that mean (Poisson arrivals, as pgbench --rate): fixed
  -- pauses would keep the connections in lockstep, every request of a round arriving at once.
  function delay() return math.floor(-math.log(1 - math.random()) * pause + 0.5) end
end
