--[[
register: announce a worker to its crawl and, when asked, flush the crawl first,
but only if no other worker is alive: a late-starting worker with flush-on-start
must not wipe the queue that its peers are already working on.

The crawl record names the crawl's identity (a random epoch, written by the worker
that created the crawl) and its spider. A worker of another spider is refused
before it writes anything (two spiders on one crawl id would take each other's
requests); every worker remembers the epoch and presents it at each heartbeat, so
a crawl whose state vanished (Redis restarted empty, flushed, purged) is noticed
and never taken for a finished one.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)
KEYS[2]  record    HASH   epoch, spider, created_ms, finished_ms, purged_ms,
                          purging_ms (purge_if_done.lua)
KEYS[3]  queue     ZSET   queued requests
KEYS[4]  inflight  HASH   leased requests
KEYS[5]  stats     HASH   fleet-wide counters (acked: requests done)
KEYS[6]  starting  ZSET   workers still producing start requests (this one is, now)
KEYS[7]  busy      HASH   lane -> the crawl's requests in flight
KEYS[8]  group_busy HASH  lane -> the politeness group's requests in flight: a flush
                          takes the crawl's counts out of it (lib/group.lua), and
                          keeps the key (it is the group's, not the crawl's)
KEYS[9 ..]         every other key of the crawl (deleted by a flush); of a sharded
                   crawl, each shard's busy HASH first (ARGV[7] of them), whose
                   counts a flush takes out of group_busy as it does KEYS[7]'s

ARGV[1]  worker    worker id
ARGV[2]  flush     "1" to flush, "0" not to
ARGV[3]  alive_ms  a worker whose heartbeat is younger than this is alive
ARGV[4]  spider    the spider's name
ARGV[5]  epoch     a fresh random epoch, taken if this worker creates the crawl
ARGV[6]  shards    the worker's REDISSPINE_SHARDS (absent: 1). A crawl keeps the
                   number it was created with (the record's `shards`, absent: 1):
                   its lanes live where that number put them
ARGV[7]  shard_busy  how many of KEYS[9 ..] are shards' busy HASHes (absent: 0)

Returns { flushed, alive, status, epoch, detail }: flushed is 1 when the crawl was
flushed; alive is the number of other workers alive; status is "created" (a new
crawl, or one without a record), "joined", "finished" (the record says the crawl
finished and nothing is queued or in flight; detail: "finished_ms acked") or
"conflict" (detail: the crawl's spider; nothing was written) or "shards" (detail:
the crawl's number of shards, which is not ARGV[6]; nothing was written) or
"purging" (a sharded crawl's last worker was deleting it, persistence off: the
caller finishes that, then registers again; nothing was written); epoch is the
crawl's.
]]
-- #include clock
-- #include group
-- #include lists
local workers, record, queue, inflight, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local starting = KEYS[6]
local busy, group_busy = KEYS[7], KEYS[8]
local worker, flush, alive_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local spider, fresh_epoch = ARGV[4], ARGV[5]
local shards, shard_busy = ARGV[6] or "1", tonumber(ARGV[7] or "0")
local now_ms = clock_ms()
local alive = redis.call("ZCOUNT", workers, now_ms - alive_ms, "+inf")
local own = redis.call("ZSCORE", workers, worker)
if own and tonumber(own) >= now_ms - alive_ms then
    alive = alive - 1  -- this worker re-registering is not "another" worker
end
local flushed = 0
local function read_record()
    return redis.call("HMGET", record, "epoch", "spider", "finished_ms", "shards",
                      "purging_ms")
end
local known = read_record()
if known[2] and known[2] ~= spider and not (flush == "1" and alive == 0) then
    return { 0, alive, "conflict", known[1] or "", known[2] }
end
if known[1] and (known[4] or "1") ~= shards and not (flush == "1" and alive == 0) then
    return { 0, alive, "shards", known[1], known[4] or "1" }
end
if known[1] and known[5] and not (flush == "1" and alive == 0) then
    return { 0, alive, "purging", known[1], "" }
end
-- A non-denyoom write first: Redis checks maxmemory only before a script's first
-- write, and a worker must be able to register (a few bytes) on a full Redis.
redis.call("ZREM", workers, worker)
if flush == "1" and alive == 0 then
    group_forget(busy, group_busy)
    for i = 9, 8 + shard_busy do
        group_forget(KEYS[i], group_busy)
    end
    lists_delete_queues(KEYS, 1) -- a queue's lists (lib/lists.lua) before the queue
    redis.call("DEL", unpack(KEYS, 1, 7))
    if #KEYS >= 9 then
        redis.call("DEL", unpack(KEYS, 9))
    end
    flushed = 1
    known = read_record()
end
local status, epoch, detail = "joined", known[1], ""
if not epoch then
    status, epoch = "created", fresh_epoch
    redis.call("HDEL", record, "purged_ms", "finished_ms", "shards")
    redis.call("HSET", record, "epoch", epoch, "spider", spider, "created_ms", now_ms)
    if shards ~= "1" then
        redis.call("HSET", record, "shards", shards)
    end
elseif known[3] and redis.call("ZCARD", queue) == 0 and redis.call("HLEN", inflight) == 0 then
    status = "finished"
    detail = known[3] .. " " .. (redis.call("HGET", stats, "acked") or "0")
end
redis.call("ZADD", workers, now_ms, worker)
redis.call("ZADD", starting, now_ms, worker)
return { flushed, alive, status, epoch, detail }
