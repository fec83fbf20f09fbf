--[[
reinject_dead: put dead letters back in the queue (after the cause was fixed),
in their lane with their priority and order key, and a fresh requeue budget.
Entries without a valid lane (malformed members) stay dead.

KEYS[1]  dead      HASH   dead letters: field -> reason \n member
KEYS[2]  queue     ZSET   score 0, member = lane \0 priority key order key payload
KEYS[3]  requeues  HASH   order key -> times requeued
KEYS[4]  stats     HASH   fleet-wide counters
KEYS[5]  hosts     ZSET   (lib/lanes.lua)
KEYS[6]  busy      HASH   (lib/lanes.lua)
KEYS[7]  backlog   HASH   (lib/lanes.lua)
KEYS[8]  host_next HASH   (lib/lanes.lua)
KEYS[9]  record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[10] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[11] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  concurrency  most requests of one lane in flight fleet-wide
ARGV[3 ..]            dead-letter fields to re-inject

Returns { reinjected, repairs }: the number re-injected, and the values of crawl
keys repaired (lib/numbers.lua). Every key's type is checked before the first write.
]]
-- #include clock
-- #include crawl
-- #include member
-- #include lanes
-- #include numbers
-- #include keytypes
local dead, queue, requeues, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local hosts, busy, backlog, host_next = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local record = KEYS[9]
local lane_limits = KEYS[10]
local group_busy = KEYS[11]
local epoch, concurrency = ARGV[1], tonumber(ARGV[2])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, clock_ms(), lane_limits,
           group_busy)
keys_expect(dead, "hash", queue, "zset", requeues, "hash", hosts, "zset", busy, "hash",
            backlog, "hash", host_next, "hash")

local reinjected = 0
for i = 3, #ARGV do
    local entry = redis.call("HGET", dead, ARGV[i])
    if entry then
        local reason_end = string.find(entry, "\n", 1, true)
        local lane, key, member
        if reason_end then
            member = string.sub(entry, reason_end + 1)
            lane, key = member_lane(member)
        end
        if lane then
            redis.call("ZADD", queue, 0, member)
            redis.call("HDEL", requeues, key)
            redis.call("HDEL", dead, ARGV[i])
            host_enqueued(lane)
            reinjected = reinjected + 1
        end
    end
end
if reinjected > 0 then
    stats_add(stats, "reinjected", reinjected)
end
return { reinjected, numbers_repairs() }
