--[[
purge_if_done: delete every key of a crawl, but only when the crawl is done
(nothing queued, nothing in flight, no live worker still producing start
requests), so that a worker closing with persistence off can never delete work
that another worker still needs.

While other workers are still alive (they are about to find the crawl done and
close too), the crawl record stays, saying the crawl finished: they must not take
the missing keys for lost state. The last one deletes it with the rest.

KEYS[1]  queue     ZSET   queued requests
KEYS[2]  inflight  HASH   leased requests
KEYS[3]  record    HASH   the crawl record (see register.lua)
KEYS[4]  workers   ZSET   worker id -> last heartbeat (ms)
KEYS[5]  starting  ZSET   workers still producing start requests
KEYS[6 ..]         every other key of the crawl; of a sharded crawl on one server,
                   each shard's queue and inflight first (ARGV[4] pairs), which
                   must be empty too

ARGV[1]  worker    the closing worker's id (it leaves `workers` here)
ARGV[2]  epoch     its crawl's epoch ("" for a tool: no check)
ARGV[3]  alive_ms  a worker whose heartbeat is younger than this is alive
ARGV[4]  shard_pairs  how many (queue, inflight) pairs of shards open KEYS[6 ..]
                   (absent: 0)
ARGV[5]  keep_record  "1": the crawl's shards are in other slots (Redis Cluster) and
                   are deleted after this, one by one (sharded_upkeep.py): the last
                   worker keeps the record, marked `purging_ms`, until they are
ARGV[6]  shards    a sharded crawl's N (absent or "1": unsharded): once the crawl is
                   deleted its record keeps only `shards`, so that its items streams,
                   one per shard and kept, are still found (`redisspine export`)

Returns 2 when the crawl was deleted (but for that note of its shards), 3 when all but its record was and its shards
are to be deleted (keep_record), 1 when all but its record was (other workers are
alive), 0 when work remains or the crawl is not the caller's.
]]
-- #include clock
-- #include crawl
local queue, inflight, record, workers, starting = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, epoch, alive_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local shard_pairs, keep_record = tonumber(ARGV[4] or "0"), ARGV[5] == "1"
local shards = tonumber(ARGV[6] or "1")
if crawl_status(record, epoch) ~= "ok" then
    return 0
end
local now_ms = clock_ms()
redis.call("ZREM", starting, worker) -- a worker that closes is done starting
-- and it leaves here, in the same step: two workers closing at once must not each
-- count the other as alive, or neither deletes the record
redis.call("ZREM", workers, worker)
if redis.call("ZCARD", queue) > 0 or redis.call("HLEN", inflight) > 0
        or redis.call("ZCOUNT", starting, now_ms - alive_ms, "+inf") > 0 then
    return 0
end
for i = 6, 5 + 2 * shard_pairs, 2 do
    if redis.call("ZCARD", KEYS[i]) > 0 or redis.call("HLEN", KEYS[i + 1]) > 0 then
        return 0
    end
end
local others = redis.call("ZCOUNT", workers, now_ms - alive_ms, "+inf")
if others > 0 then
    redis.call("DEL", unpack(KEYS, 6))
    redis.call("DEL", queue, inflight, starting)
    redis.call("HSET", record, "finished_ms", now_ms)
    return 1
end
if keep_record then
    -- the shards are deleted next; a worker registering meanwhile finishes that
    -- first (register.lua: status "purging")
    redis.call("DEL", queue, inflight, workers, starting)
    if #KEYS >= 6 then
        redis.call("DEL", unpack(KEYS, 6))
    end
    redis.call("HSET", record, "finished_ms", now_ms, "purging_ms", now_ms)
    return 3
end
redis.call("DEL", unpack(KEYS))
if shards > 1 then
    redis.call("HSET", record, "shards", shards) -- no epoch: writers find it "lost"
end
return 2
