--[[
release: put leased requests of one owner back in the queue exactly as they were
(same lane, priority and order key), e.g. the unstarted leases of a worker that
stops. Not counted as a requeue (the request was never tried) and the lane does
not rest (nothing was fetched): its slot is simply free again.

KEYS[1]  queue     ZSET   score 0, member = lane \0 priority key order key payload
KEYS[2]  inflight  HASH   order key -> owner \n token \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms)
KEYS[4]  stats     HASH   fleet-wide counters
KEYS[5]  owned     ZSET   score 0, member owner \n order key
KEYS[6]  hosts     ZSET   (lib/lanes.lua)
KEYS[7]  busy      HASH   (lib/lanes.lua)
KEYS[8]  backlog   HASH   (lib/lanes.lua)
KEYS[9]  host_next HASH   (lib/lanes.lua)
KEYS[10] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[11] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[12] lane_pages HASH  lane -> requests leased: a put-back gives one back (lib/putback.lua)
KEYS[13] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  owner        worker id
ARGV[3]  concurrency  most requests of one lane in flight fleet-wide
ARGV[4 ..]            order key, lease token, order key, lease token ...

Returns { released, repairs }: the number of requests put back (fenced: others'
leases are left alone), and the values of crawl keys repaired (lib/numbers.lua).
Every key's type is checked before the first write.
]]
-- #include clock
-- #include crawl
-- #include lanes
-- #include entry
-- #include putback
-- #include numbers
-- #include keytypes
local queue, inflight, leases, stats, owned = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local hosts, busy, backlog, host_next = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local record = KEYS[10]
local lane_limits, lane_pages = KEYS[11], KEYS[12]
local group_busy = KEYS[13]
local epoch, owner, concurrency = ARGV[1], ARGV[2], tonumber(ARGV[3])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, clock_ms(), lane_limits,
           group_busy)
entry_init(inflight, leases, owned)
keys_expect(queue, "zset", inflight, "hash", leases, "zset", owned, "zset", hosts, "zset",
            busy, "hash", backlog, "hash", host_next, "hash", lane_pages, "hash")

local released = 0
for i = 4, #ARGV, 2 do
    local key, token = ARGV[i], ARGV[i + 1]
    local member = fenced_member(key, owner, token)
    if member then
        put_back(queue, lane_pages, owner, key, member)
        released = released + 1
    end
end
if released > 0 then
    stats_add(stats, "released", released)
end
return { released, numbers_repairs() }
