--[[
lease: hand up to `count` requests to one worker, recording each in in-flight in
the same atomic step, so that a request is always either queued or leased.

KEYS[1]  queue     ZSET   score = -priority, member = order key .. payload
KEYS[2]  inflight  HASH   order key -> owner \n score \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms, Redis TIME)
KEYS[4]  stats     HASH   fleet-wide counters

ARGV[1]  owner     worker id
ARGV[2]  count     most requests to lease (>= 0)

Returns { members, queued, inflight }: the leased queue members (highest
priority first), then how many requests stay queued and in flight fleet-wide
after this lease (the worker's termination check needs no extra round trip).
]]
local queue, inflight, leases, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner = ARGV[1]
local count = tonumber(ARGV[2])

local members = {}
if count > 0 then
    local popped = redis.call("ZPOPMIN", queue, count)
    if #popped > 0 then
        local time = redis.call("TIME")
        local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
        for i = 1, #popped, 2 do
            local member, score = popped[i], popped[i + 1]
            local key = string.sub(member, 1, 15)
            redis.call("HSET", inflight, key, owner .. "\n" .. score .. "\n" .. member)
            redis.call("ZADD", leases, now_ms, key)
            members[#members + 1] = member
        end
        redis.call("HINCRBY", stats, "leased", #members)
    end
end
return { members, redis.call("ZCARD", queue), redis.call("HLEN", inflight) }
