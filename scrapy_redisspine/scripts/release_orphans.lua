--[[
release_orphans: put back the leases of one worker that the worker does not know
it holds: a lease call whose reply was lost (connection dropped after Redis ran
it) leaves leases recorded for a worker that never received them. The worker,
alive and heartbeating, would never be swept, so it returns them itself.

KEYS[1]  owned     ZSET   score 0, member owner \n order key
KEYS[2]  inflight  HASH   order key -> owner \n token \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms)
KEYS[4]  queue     ZSET   score 0, member = lane \0 priority key order key payload
KEYS[5]  stats     HASH   fleet-wide counters
KEYS[6]  hosts     ZSET   (lib/lanes.lua)
KEYS[7]  busy      HASH   (lib/lanes.lua)
KEYS[8]  backlog   HASH   (lib/lanes.lua)
KEYS[9]  host_next HASH   (lib/lanes.lua)
KEYS[10] dead      HASH   dead letters: order key -> reason \n entry (in-flight entries
                          that are not "owner \n token \n member")
KEYS[11] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[12] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[13] lane_pages HASH  lane -> requests leased: a put-back gives one back (lib/putback.lua)
KEYS[14] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  owner        worker id
ARGV[3]  limit        most leases to look at
ARGV[4]  concurrency  most requests of one lane in flight fleet-wide
ARGV[5 ..]            order keys this worker knows it holds (kept)

Returns { released, repairs }: the number of leases put back, and the values of
crawl keys repaired (lib/numbers.lua). Every key's type is checked before the first
write.
]]
-- #include clock
-- #include crawl
-- #include lanes
-- #include entry
-- #include putback
-- #include numbers
-- #include keytypes
local owned, inflight, leases, queue, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local hosts, busy, backlog, host_next, dead = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local record = KEYS[11]
local lane_limits, lane_pages = KEYS[12], KEYS[13]
local group_busy = KEYS[14]
local epoch, owner, limit, concurrency = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, clock_ms(), lane_limits,
           group_busy)
entry_init(inflight, leases, owned)
keys_expect(owned, "zset", inflight, "hash", leases, "zset", queue, "zset", hosts, "zset",
            busy, "hash", backlog, "hash", host_next, "hash", dead, "hash",
            lane_pages, "hash")

local known = {}
for i = 5, #ARGV do
    known[ARGV[i]] = true
end
local released = 0
local held = redis.call("ZRANGEBYLEX", owned, "[" .. owner .. "\n", "(" .. owner .. "\v",
                        "LIMIT", 0, limit)
for _, owned_member in ipairs(held) do
    local key = string.sub(owned_member, #owner + 2)
    if not known[key] then
        local entry = entry_get(key)
        local entry_owner, member
        if entry then
            entry_owner, member = entry_parts(entry)
        end
        if entry_owner == owner then
            put_back(queue, lane_pages, owner, key, member)
            released = released + 1
        elseif entry and not entry_owner then
            entry_bury_malformed(dead, key, entry, owner)
        else -- gone, or another worker's lease since: only this index entry is stale
            redis.call("ZREM", owned, owned_member)
            if not entry then
                lease_forget(key)
            end
        end
    end
end
if released > 0 then
    stats_add(stats, "released", released)
end
return { released, numbers_repairs() }
