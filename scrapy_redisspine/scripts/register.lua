--[[
register: announce a worker to its crawl and, when asked, flush the crawl first,
but only if no other worker is alive: a late-starting worker with flush-on-start
must not wipe the queue that its peers are already working on.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)
KEYS[2 ..]         every other key of the crawl (deleted by a flush)

ARGV[1]  worker    worker id
ARGV[2]  flush     "1" to flush, "0" not to
ARGV[3]  alive_ms  a worker whose heartbeat is younger than this is alive

Returns { flushed, alive }: flushed is 1 when the crawl was flushed; alive is the
number of other workers alive.
]]
-- #include clock
local workers = KEYS[1]
local worker, flush, alive_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now_ms = clock_ms()
local alive = redis.call("ZCOUNT", workers, now_ms - alive_ms, "+inf")
local own = redis.call("ZSCORE", workers, worker)
if own and tonumber(own) >= now_ms - alive_ms then
    alive = alive - 1  -- this worker re-registering is not "another" worker
end
-- A non-denyoom write first: Redis checks maxmemory only before a script's first
-- write, and a worker must be able to register (a few bytes) on a full Redis.
redis.call("ZREM", workers, worker)
local flushed = 0
if flush == "1" and alive == 0 then
    redis.call("DEL", unpack(KEYS))
    flushed = 1
end
redis.call("ZADD", workers, now_ms, worker)
return { flushed, alive }
