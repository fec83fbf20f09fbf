--[[
hosts library: fleet-wide politeness bookkeeping, included by every script that
moves a request between the queue and in-flight.

A queue member is  lane \0 priority key (10) order key (15) payload ; all members
have score 0, so one lex range of the queue holds a lane's requests, highest
priority first, then FIFO (or LIFO) by order key.

The including script declares these locals before the include line:
  hosts        ZSET  lane -> time (ms) it may next be leased; holds exactly the lanes
                     with queued requests and a free slot
  busy         HASH  lane -> requests in flight fleet-wide
  backlog      HASH  lane -> requests queued
  host_next    HASH  lane -> earliest time (ms) of its next fetch (end of the last
                     fetch + delay, or a Retry-After block)
  concurrency  number, most requests of one lane in flight fleet-wide
  now_ms       number, Redis TIME in ms
]]
local function member_lane(member)
    local sep = string.find(member, "\0", 1, true)
    if not sep then
        return nil, nil
    end
    local key = string.sub(member, sep + 11, sep + 25)
    if #key ~= 15 or not string.match(key, "^%d+$") then
        return nil, nil
    end
    return string.sub(member, 1, sep - 1), key
end

local function lane_range(lane)
    return "[" .. lane .. "\0", "(" .. lane .. "\1"
end

-- Put the lane in `hosts` at the time it may next be leased, or take it out, given
-- its queued and in-flight counts and its next time (each read here when nil).
local function host_schedule_with(lane, queued, in_flight, next_at)
    if queued <= 0 then
        redis.call("ZREM", hosts, lane)
        redis.call("HDEL", backlog, lane)
        return
    end
    if in_flight >= concurrency then
        redis.call("ZREM", hosts, lane) -- the release of a slot puts it back
        return
    end
    next_at = next_at or tonumber(redis.call("HGET", host_next, lane) or "0")
    redis.call("ZADD", hosts, next_at, lane)
end

local function host_schedule(lane)
    host_schedule_with(lane, tonumber(redis.call("HGET", backlog, lane) or "0"),
                       tonumber(redis.call("HGET", busy, lane) or "0"))
end

local function host_enqueued(lane)
    redis.call("HINCRBY", backlog, lane, 1)
    if not redis.call("ZSCORE", hosts, lane) then
        host_schedule(lane)
    end
end

-- A request (or n) of the lane left in-flight. rest_ms: the lane rests that long from now
-- (a fetch ended); nil: no fetch happened, its next time stays as it was. Lanes due
-- at once are scored with the time they became free, so the longest waiting goes
-- first; only a rest that ends in the future is written down.
local function host_released(lane, rest_ms, n)
    local in_flight = redis.call("HINCRBY", busy, lane, -(n or 1))
    if in_flight <= 0 then
        redis.call("HDEL", busy, lane)
        in_flight = 0
    end
    local next_at = tonumber(redis.call("HGET", host_next, lane) or "0")
    if rest_ms and now_ms + rest_ms > next_at then
        next_at = now_ms + rest_ms
        if rest_ms > 0 then
            redis.call("HSET", host_next, lane, next_at)
        end
    end
    host_schedule_with(lane, tonumber(redis.call("HGET", backlog, lane) or "0"), in_flight,
                       next_at)
end
