--[[
requeue library: put one lease back in the queue, or into the dead letters once it
was requeued too often.
Includes member, lanes, entry, numbers. Needs lanes_init and entry_init called first
(by the script), then requeue_init.

requeue_init(queue, requeues, dead, host_delay, max_requeues, rest_ms, lane_rests)
  queue         ZSET  the crawl's queue
  requeues      HASH  order key -> times requeued
  dead          HASH  dead letters: order key -> reason \n member
  host_delay    HASH  lane -> robots.txt Crawl-delay (s)
  max_requeues  number: a lease requeued more often goes to the dead letters
  rest_ms       number: how long a requeued request's lane rests (its dead worker may
                have been mid-fetch), at least the lane's Crawl-delay
  lane_rests    table lane -> ms, for lanes with a delay of their own (instead of
                rest_ms)

requeue_lease(key, reason [, owner]) -> "q" requeued, "d" dead-lettered, "" nothing to
do (already acked, released or requeued: this is what makes concurrent sweeps safe;
its index entries are removed, in owned too if the caller knows the owner). An
entry that is not one lease.lua writes is dead-lettered as it is. A requeue count or
a Crawl-delay that is no number is dropped (lib/numbers.lua): the request gets a
fresh budget, the lane rests rest_ms.

The keys and numbers are read before the first write; the caller checks the types
of queue and dead.
]]
-- #include member
-- #include lanes
-- #include entry
-- #include numbers
local requeue_queue, requeue_counts, requeue_dead, requeue_delays
local requeue_max, requeue_rest_ms, requeue_lane_rests

local function requeue_init(queue, requeues, dead, host_delay, max_requeues, rest_ms, lane_rests)
    if not (queue and requeues and dead and host_delay and max_requeues and rest_ms
            and lane_rests) then
        error("requeue_init: a key or number is missing")
    end
    requeue_queue, requeue_counts, requeue_dead, requeue_delays = queue, requeues, dead, host_delay
    requeue_max, requeue_rest_ms, requeue_lane_rests = max_requeues, rest_ms, lane_rests
end

local function requeue_rest(lane)
    if lane == "" then
        return 0 -- URLs without a host are never delayed (politeness.py)
    end
    local rest = requeue_lane_rests[lane] or requeue_rest_ms
    local raw = redis.call("HGET", requeue_delays, lane)
    local crawl_delay = time_of(raw)
    if not crawl_delay or crawl_delay < 0 then
        numbers_drop(requeue_delays, lane, raw)
    elseif raw then
        rest = math.max(rest, math.floor(crawl_delay * 1000))
    end
    return rest
end

-- How often the lease `key` was requeued before (a count that is no number: dropped).
local function requeue_times(key)
    local raw = redis.call("HGET", requeue_counts, key)
    local times = count_of(raw)
    if not times then
        numbers_drop(requeue_counts, key, raw)
        return 0
    end
    return times
end

local function requeue_lease(key, reason, owner_hint)
    local entry = entry_get(key)
    if not entry then
        lease_forget(key, owner_hint)
        return ""
    end
    local owner, member = entry_parts(entry)
    if not owner then
        entry_bury_malformed(requeue_dead, key, entry, owner_hint)
        return "d"
    end
    local lane = member_lane(member)
    local times = requeue_times(key) + 1
    local rest = lane and requeue_rest(lane)
    lease_end(owner, key)
    local outcome = "q"
    if times > requeue_max or not lane then
        redis.call("HDEL", requeue_counts, key)
        local why = string.gsub(reason, "\n", " ") .. "; requeued " .. (times - 1) .. " times"
        redis.call("HSET", requeue_dead, key, why .. "\n" .. member)
        outcome = "d"
    else
        redis.call("HSET", requeue_counts, key, times)
        redis.call("ZADD", requeue_queue, 0, member)
    end
    if lane then
        host_released(lane, rest, outcome == "q")
    end
    return outcome
end
