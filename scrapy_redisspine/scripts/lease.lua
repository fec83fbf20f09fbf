--[[
lease: hand up to `count` requests to one worker, recording each in in-flight in
the same atomic step, so that a request is always either queued or leased.

A queue member that does not start with a 15-digit order key, or whose key is
already leased, was not written by enqueue: it goes to the dead letters (under a
fresh field, so two of them can never overwrite each other or a live lease).

KEYS[1]  queue     ZSET   score = -priority, member = order key .. payload
KEYS[2]  inflight  HASH   order key -> owner \n score \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms, Redis TIME)
KEYS[4]  stats     HASH   fleet-wide counters
KEYS[5]  dead      HASH   dead letters: field -> reason \n score \n member
KEYS[6]  seq       STRING counter, numbers the dead letters' fields

ARGV[1]  owner     worker id
ARGV[2]  count     most requests to lease (>= 0)

Returns { members, queued, inflight, malformed }: the leased queue members
(highest priority first), how many requests stay queued and in flight fleet-wide
after this lease (the worker's termination check needs no extra round trip), and
how many malformed members went to the dead letters.
]]
local queue, inflight, leases, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, seq = KEYS[5], KEYS[6]
local owner = ARGV[1]
local count = tonumber(ARGV[2])

local members = {}
local malformed = 0
if count > 0 then
    local popped = redis.call("ZPOPMIN", queue, count)
    if #popped > 0 then
        local time = redis.call("TIME")
        local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
        for i = 1, #popped, 2 do
            local member, score = popped[i], popped[i + 1]
            local key = string.sub(member, 1, 15)
            if #member >= 15 and string.match(key, "^%d+$")
                    and redis.call("HEXISTS", inflight, key) == 0 then
                redis.call("HSET", inflight, key, owner .. "\n" .. score .. "\n" .. member)
                redis.call("ZADD", leases, now_ms, key)
                members[#members + 1] = member
            else
                local field = "malformed:" .. redis.call("INCR", seq)
                redis.call("HSET", dead, field, "malformed queue member\n" .. score .. "\n" .. member)
                malformed = malformed + 1
            end
        end
        if #members > 0 then
            redis.call("HINCRBY", stats, "leased", #members)
        end
        if malformed > 0 then
            redis.call("HINCRBY", stats, "dead_lettered", malformed)
        end
    end
end
return { members, redis.call("ZCARD", queue), redis.call("HLEN", inflight), malformed }
