--[[
requeue library: put one lease back in the queue, or into the dead letters once it
was requeued too often. Requires lib/member.lua, lib/lanes.lua and lib/entry.lua included first, and the locals
queue, inflight, leases, owned, requeues, dead, host_delay (keys), max_requeues
(number), rest_ms and lane_rests (how long a lane rests: its dead worker may have been
mid-fetch; rest_ms by default, lane_rests[lane] where a lane has its own delay, and at
least the lane's robots.txt Crawl-delay from host_delay).

requeue_lease(key, reason) -> "q" requeued, "d" dead-lettered, "" nothing to do
(already acked, released or requeued: this is what makes concurrent sweeps safe).
]]
-- #include member
-- #include lanes
-- #include entry
local function requeue_rest(lane)
    if lane == "" then
        return 0 -- URLs without a host are never delayed (politeness.py)
    end
    local rest = lane_rests[lane] or rest_ms
    local crawl_delay = tonumber(redis.call("HGET", host_delay, lane) or "")
    if crawl_delay then
        rest = math.max(rest, math.floor(crawl_delay * 1000))
    end
    return rest
end

local function requeue_lease(key, reason)
    local entry = redis.call("HGET", inflight, key)
    if not entry then
        redis.call("ZREM", leases, key)
        return ""
    end
    local owner, member = entry_parts(entry)
    lease_end(owner, key)
    local lane = member_lane(member)
    local times = redis.call("HINCRBY", requeues, key, 1)
    local outcome = "q"
    if times > max_requeues or not lane then
        redis.call("HDEL", requeues, key)
        local why = string.gsub(reason, "\n", " ") .. "; requeued " .. (times - 1) .. " times"
        redis.call("HSET", dead, key, why .. "\n" .. member)
        outcome = "d"
    else
        redis.call("ZADD", queue, 0, member)
    end
    if lane then
        host_released(lane, requeue_rest(lane), outcome == "q")
    end
    return outcome
end
