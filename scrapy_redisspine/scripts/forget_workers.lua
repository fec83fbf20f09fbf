--[[
forget_workers: take dead workers off the crawl's worker list once a sweep of every
shard of a sharded crawl took their leases (requeue_stale.lua with remove "0" keeps
them listed until then: a worker removed after the first shard's sweep would look
like no worker at all to the others', and its leases there would stay in flight).

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)

ARGV[1]  timeout_ms  a worker silent for longer is dead
ARGV[2 ..]           the workers every shard's sweep reported as swept

A worker that beat again since (its score is recent) stays: it is alive. Returns
how many workers were removed.
]]
-- #include clock
local workers = KEYS[1]
local cutoff = clock_ms() - tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
    local score = tonumber(redis.call("ZSCORE", workers, ARGV[i]) or "")
    if score and score < cutoff then
        removed = removed + redis.call("ZREM", workers, ARGV[i])
    end
end
return removed
