--[[
copy_workers: replace a shard's copy of the crawl's heartbeats (Redis Cluster with
REDISSPINE_SHARDS > 1 only: keys.CLUSTER_SHARD_COPIES). The shard's sweep
(requeue_stale.lua) reads the copy, since the crawl's own `workers` is in another
slot; sharded.py copies it just before each sweep, so the sweep judges the
heartbeats as they were a round trip earlier.

KEYS[1]  workers   ZSET   the shard's copy: worker id -> last heartbeat (ms)

ARGV[1 ..]         pairs: worker id, heartbeat (ms), as the crawl's `workers` holds them

Returns how many workers the copy holds.
]]
local workers = KEYS[1]
redis.call("DEL", workers)
for i = 1, #ARGV - 1, 2 do
    redis.call("ZADD", workers, ARGV[i + 1], ARGV[i])
end
return redis.call("ZCARD", workers)
