--[[
take_slot: lease one of a lane's fleet-wide slots for a request that is not in the
queue: one that could not be stored (its meta holds an object no worker could
rebuild) and lives in this worker's memory alone. It is fetched under the lane's
politeness like any other request: the slot is taken only when the lane is due
and has one free, and the lane rests after it as after any fetch.

The lease is an ordinary in-flight entry (owner, fencing token, a queue member of
the lane with `payload`, a marker that names the request), so the ack, the release
and the sweeps treat it like any other. Should this worker die, a sweep requeues
the marker; whoever leases it cannot rebuild a request from it and buries it, with
the reason the marker gives: the loss is seen in the dead letters.

KEYS[1]  inflight  HASH   order key -> owner \n token \n member
KEYS[2]  leases    ZSET   order key -> lease time (ms)
KEYS[3]  owned     ZSET   score 0, member owner \n order key
KEYS[4]  seq       STRING counter: order keys and fencing tokens
KEYS[5]  stats     HASH   fleet-wide counters
KEYS[6]  queue     ZSET   (lib/lanes.lua)
KEYS[7]  hosts     ZSET   (lib/lanes.lua)
KEYS[8]  busy      HASH   (lib/lanes.lua)
KEYS[9]  backlog   HASH   (lib/lanes.lua)
KEYS[10] host_next HASH   (lib/lanes.lua)
KEYS[11] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[12] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[13] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch (lib/crawl.lua)
ARGV[2]  owner        worker id
ARGV[3]  concurrency  most requests of one lane in flight fleet-wide
ARGV[4]  lane         the lane whose slot to take
ARGV[5]  priority     the request's priority key (members.py: 5 characters)
ARGV[6]  payload      the marker naming the request

Returns { order key, token, wait_ms, repairs }: the lease (order key "" when the
lane has no free slot or is resting), and in how many ms the lane is due (0: a
slot is busy, ask again when one is freed). Slots and rest are the politeness
group's: a slot held by another crawl of the group counts as busy.
]]
-- #include clock
-- #include crawl
-- #include member
-- #include lanes
-- #include numbers
-- #include keytypes
local inflight, leases, owned, seq, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queue, hosts, busy, backlog, host_next = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local record = KEYS[11]
local lane_limits = KEYS[12]
local group_busy = KEYS[13]
local epoch, owner, concurrency = ARGV[1], ARGV[2], tonumber(ARGV[3])
local lane, priority, payload = ARGV[4], ARGV[5], ARGV[6]
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
local now_ms = clock_ms()
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, lane_limits,
           group_busy)
keys_expect(inflight, "hash", leases, "zset", owned, "zset", busy, "hash", host_next, "hash")

local read = lanes_read({ lane })
-- The group's count includes this crawl's; the larger one rules should they disagree.
local in_flight = math.max(count_of(read[1][1]) or 0, count_of(read[5][1]) or 0)
local next_at = time_of(read[3][1]) or 0
if in_flight >= read[4][lane] then
    return { "", 0, 0, numbers_repairs() }
end
if next_at > now_ms then
    return { "", 0, next_at - now_ms, numbers_repairs() }
end
-- One number from seq for the order key, one for the token.
local first = seq_take(seq, 2)
local key = member_order_key(first - 1, false)
local token = first
local member = member_make(lane, priority, key, payload)
redis.call("HSET", inflight, key, owner .. "\n" .. token .. "\n" .. member)
redis.call("ZADD", leases, now_ms, key)
redis.call("ZADD", owned, 0, owner .. "\n" .. key)
lanes_write({ lane }, read, { [lane] = 1 }, nil, nil, false)
stats_add(stats, "leased", 1)
return { key, token, 0, numbers_repairs() }
