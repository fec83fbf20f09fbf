--[[
shard_counts: one shard's part of the fleet's termination count, read atomically:
what it holds (queued, in flight), whether it ever had work, and its change stamp.

A sharded crawl (REDISSPINE_SHARDS > 1) cannot read all its shards in one atomic
step (on Redis Cluster they live on several masters). The caller reads every shard,
then every shard again (a double collect, _shards.py): only when each shard held
nothing and its stamp did not move between its two readings was the whole crawl
idle at one instant. The stamp is the sum of the shard's stats counters that grow
with every change of its queued + in-flight total or of where a request is
(enqueued, acked, leased, released, requeued, reinjected, dead_lettered,
host_page_limited); each only grows, so an unchanged sum means no change.

KEYS[1]  queue     ZSET   the shard's queued requests
KEYS[2]  inflight  HASH   the shard's leased requests
KEYS[3]  stats     HASH   the shard's counters (any type: a broken one reads as 0)

Returns { queued, inflight, ever, stamp }: ever is 1 once the shard queued or leased
any request; stamp as above (a counter that is no count adds nothing).
]]
-- #include numbers
-- #include lists
local queue, inflight, stats = KEYS[1], KEYS[2], KEYS[3]
local counted = redis.pcall("HMGET", stats, "enqueued", "acked", "leased", "released",
                            "requeued", "reinjected", "dead_lettered", "host_page_limited")
local stamp, ever = 0, 0
if type(counted) == "table" then
    for i = 1, #counted do
        stamp = stamp + (count_of(counted[i]) or 0)
    end
    if counted[1] or counted[3] then
        ever = 1
    end
end
return { lists_size(queue), redis.call("HLEN", inflight), ever, stamp }
