--[[
record_progress: add a rate sample (this worker's acks and the fleet's, at Redis
time) to the crawl's progress and forget samples older than the window, if the
crawl is still the caller's (a sample must not re-create a crawl that vanished).

KEYS[1]  progress  ZSET   score = time (ms), member "ms:worker:worker acks:fleet acks"
KEYS[2]  record    HASH   the crawl record (lib/crawl.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check)
ARGV[2]  worker       worker id
ARGV[3]  worker_acks  acks of this worker so far
ARGV[4]  fleet_acks   acks of the whole fleet so far
ARGV[5]  window_ms    how long samples are kept

Returns 1 when the sample was added, 0 when the crawl is not the caller's.
]]
-- #include clock
-- #include crawl
local progress, record = KEYS[1], KEYS[2]
local epoch, worker, worker_acks, fleet_acks = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local window_ms = tonumber(ARGV[5])
if crawl_status(record, epoch) ~= "ok" then
    return 0
end
local now_ms = clock_ms()
redis.call("ZADD", progress, now_ms,
           now_ms .. ":" .. worker .. ":" .. worker_acks .. ":" .. fleet_acks)
redis.call("ZREMRANGEBYSCORE", progress, "-inf", now_ms - window_ms)
return 1
