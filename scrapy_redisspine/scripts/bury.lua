--[[
bury: move a leased request that can never be processed (its payload does not
decode, names a forbidden class or callback ...) to the dead-letter HASH with the
reason, instead of dropping it or handing it out again and again. Its lane's slot
is freed (nothing was fetched, so the lane does not rest).

KEYS[1]  inflight  HASH   order key -> owner \n token \n member
KEYS[2]  leases    ZSET   order key -> lease time (ms)
KEYS[3]  dead      HASH   order key -> reason \n member
KEYS[4]  stats     HASH   fleet-wide counters
KEYS[5]  owned     ZSET   score 0, member owner \n order key
KEYS[6]  requeues  HASH   order key -> times requeued
KEYS[7]  hosts     ZSET   (lib/lanes.lua)
KEYS[8]  busy      HASH   (lib/lanes.lua)
KEYS[9]  backlog   HASH   (lib/lanes.lua)
KEYS[10] host_next HASH   (lib/lanes.lua)
KEYS[11] queue     ZSET   (lib/lanes.lua: a lane's backlog count is counted again
                          from it if it holds no count)
KEYS[12] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[13] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[14] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  owner        worker id
ARGV[3]  key          order key of the lease
ARGV[4]  token        its lease token (fencing)
ARGV[5]  reason       one line of text
ARGV[6]  concurrency  most requests of one lane in flight fleet-wide

Returns { buried, repairs }: buried is 1 if the lease was buried, 0 if it was not
this owner's (any more); repairs lists the values of crawl keys repaired
(lib/numbers.lua). Every key's type is checked before the first write.
]]
-- #include clock
-- #include crawl
-- #include member
-- #include lanes
-- #include entry
-- #include numbers
-- #include keytypes
local inflight, leases, dead, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owned, requeues = KEYS[5], KEYS[6]
local hosts, busy, backlog, host_next, queue = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local record = KEYS[12]
local lane_limits = KEYS[13]
local group_busy = KEYS[14]
local epoch, owner, key, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local reason = string.gsub(ARGV[5], "\n", " ")
local concurrency = tonumber(ARGV[6])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, clock_ms(), lane_limits,
           group_busy)
entry_init(inflight, leases, owned)

local member = fenced_member(key, owner, token)
if not member then
    return { 0, numbers_repairs() }
end
keys_expect(dead, "hash", leases, "zset", owned, "zset", requeues, "hash", hosts, "zset",
            busy, "hash", backlog, "hash", host_next, "hash", queue, "zset")
redis.call("HSET", dead, key, reason .. "\n" .. member)
lease_end(owner, key)
redis.call("HDEL", requeues, key)
local lane = member_lane(member)
if lane then
    host_released(lane, nil)
end
stats_add(stats, "dead_lettered", 1)
return { 1, numbers_repairs() }
