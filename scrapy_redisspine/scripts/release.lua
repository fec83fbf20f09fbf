--[[
release: put leased requests of one owner back in the queue exactly as they were
(same priority and order key), e.g. the unstarted leases of a worker that stops.

KEYS[1]  queue     ZSET   score = -priority, member = order key .. payload
KEYS[2]  inflight  HASH   order key -> owner \n score \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms)
KEYS[4]  stats     HASH   fleet-wide counters

ARGV[1]  owner     worker id; leases of other owners are left alone
ARGV[2 ..]         order keys to release

Returns the number of requests put back.
]]
local queue, inflight, leases, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner_prefix = ARGV[1] .. "\n"

local released = 0
for i = 2, #ARGV do
    local entry = redis.call("HGET", inflight, ARGV[i])
    if entry and string.sub(entry, 1, #owner_prefix) == owner_prefix then
        local score_end = string.find(entry, "\n", #owner_prefix + 1, true)
        local score = string.sub(entry, #owner_prefix + 1, score_end - 1)
        redis.call("ZADD", queue, score, string.sub(entry, score_end + 1))
        redis.call("HDEL", inflight, ARGV[i])
        redis.call("ZREM", leases, ARGV[i])
        released = released + 1
    end
end
if released > 0 then
    redis.call("HINCRBY", stats, "released", released)
end
return released
