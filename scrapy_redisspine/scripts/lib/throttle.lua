--[[
throttle library: Scrapy's AutoThrottle rule, fleet-wide, one delay per lane kept in
the politeness group's `lane_throttle` HASH and fed by the latencies every worker of
every crawl of the group observes (each ack carries its request's download latency).
Includes batch, numbers. Needs throttle_init called first (by the script).

throttle_init(lane_throttle, target, start_ms, min_ms, max_ms)
  lane_throttle  HASH  lane -> its current delay (ms, a number as text)
  target         AUTOTHROTTLE_TARGET_CONCURRENCY (0: AutoThrottle is off, nothing
                 here reads or writes)
  start_ms       AUTOTHROTTLE_START_DELAY: a lane's delay before its first sample
                 (never below min_ms)
  min_ms         DOWNLOAD_DELAY: the delay never goes below it
  max_ms         AUTOTHROTTLE_MAX_DELAY: nor above it
throttle_on() -> whether AutoThrottle is on
throttle_read(lanes) -> the lanes' stored delays (one HMGET): read before the
  script's first write
throttle_write(lanes, stored, samples, rests, credits) -> adjusted: for each lane (in
  order) its delay moves through its samples (samples[lane]: a list of { latency_ms,
  status }, in ack order) by Scrapy's rule: target = latency / target concurrency, new =
  max(target, (old + target) / 2), bounded by min_ms and max_ms; a non-200 response
  never lowers it. rests[lane] becomes at least the lane's delay, sample or not (the
  delay rests the lane as DOWNLOAD_DELAY does), less credits[lane] (ms since the
  lane's fetch ended, enqueue.lua; nil: 0), credited up to the delay. Changed delays are written (one
  HSET). adjusted: flat { lane, old ms, new ms, latency ms, status } per sample, for
  AUTOTHROTTLE_DEBUG's log lines.

A stored delay that is no number is dropped and repaired (numbers.lua): the lane
starts again from start_ms.
]]
-- #include batch
-- #include numbers
local throttle_key, throttle_target, throttle_start, throttle_min, throttle_max

local function throttle_init(lane_throttle, target, start_ms, min_ms, max_ms)
    if not (lane_throttle and target and start_ms and min_ms and max_ms) then
        error("throttle_init: a key or number is missing")
    end
    throttle_key, throttle_target = lane_throttle, target
    throttle_min, throttle_max = min_ms, max_ms
    throttle_start = math.min(math.max(start_ms, min_ms), max_ms)
end

local function throttle_on()
    return throttle_target > 0
end

local function throttle_read(lanes)
    if not throttle_on() or #lanes == 0 then
        return {}
    end
    return hmget_in_chunks(throttle_key, lanes)
end

local function throttle_step(old, latency_ms, status)
    local target = latency_ms / throttle_target
    local new = math.max(target, (old + target) / 2)
    new = math.min(math.max(throttle_min, new), throttle_max)
    if status ~= 200 and new <= old then
        return old -- error pages are small and fast: they must not speed the lane up
    end
    return new
end

local function throttle_write(lanes, stored, samples, rests, credits)
    local adjusted, changed = {}, {}
    if not throttle_on() then
        return adjusted
    end
    for i, lane in ipairs(lanes) do
        local delay = stored[i] and time_of(stored[i])
        local rewrite = not stored[i]
        if stored[i] and not (delay and delay >= 0) then
            numbers_note(throttle_key, lane, stored[i], "absent")
            delay, rewrite = nil, true
        end
        delay = delay or throttle_start
        local before = delay
        for _, sample in ipairs(samples[lane] or {}) do
            local old = delay
            delay = throttle_step(old, sample[1], sample[2])
            adjusted[#adjusted + 1] = lane
            adjusted[#adjusted + 1] = string.format("%.3f", old)
            adjusted[#adjusted + 1] = string.format("%.3f", delay)
            adjusted[#adjusted + 1] = sample[1]
            adjusted[#adjusted + 1] = sample[2]
        end
        if delay ~= before or rewrite then
            changed[#changed + 1] = lane
            changed[#changed + 1] = string.format("%.3f", delay)
        end
        local rest = math.floor(delay + 0.5)
        local credit = credits and credits[lane] or 0
        rests[lane] = math.max(rests[lane] or 0, rest - math.min(credit, rest))
    end
    call_in_chunks("HSET", throttle_key, changed)
    return adjusted
end
