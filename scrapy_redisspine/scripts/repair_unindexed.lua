--[[
repair_unindexed: find in-flight entries that lack their index entries (their time in
`leases`, their owner's entry in `owned`), and index entries that point to no lease,
a bounded step at a time. Every lease is written with both index entries and loses
them only with its entry (lease.lua, lib/entry.lua), so such entries come from
outside: a script that failed halfway, an operator, another tool. A lease no index
points to is found by no sweep (they look leases up by owner and by age) and blocks
the crawl's end forever.

Each step scans one part of one structure (HSCAN/ZSCAN with the caller's cursor), in
three phases: in-flight entries, then `leases`, then `owned`. Per entry, atomically:
- an in-flight entry without an index entry: if its owner is alive (a heartbeat in
  `workers` within timeout_ms), the missing index entries are added again (its ack
  will come; its lease time is taken as now); else it is requeued as requeue_stale.lua
  would (lib/requeue.lua: lane bookkeeping, requeue count, dead letters past
  max_requeues). An entry that is not "owner \n token \n member" is dead-lettered.
- a `leases` member without an in-flight entry is removed.
- an `owned` member "owner \n key" whose key has no in-flight entry, or one of
  another owner, is removed.

KEYS[1]  inflight  HASH   order key -> owner \n token \n member
KEYS[2]  leases    ZSET   order key -> lease time (ms)
KEYS[3]  owned     ZSET   score 0, member owner \n order key
KEYS[4]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)
KEYS[5]  queue     ZSET   score 0, member = lane \0 priority key order key payload
KEYS[6]  dead      HASH   dead letters: order key -> reason \n member
KEYS[7]  requeues  HASH   order key -> times requeued
KEYS[8]  stats     HASH   fleet-wide counters
KEYS[9]  hosts     ZSET   (lib/lanes.lua)
KEYS[10] busy      HASH   (lib/lanes.lua)
KEYS[11] backlog   HASH   (lib/lanes.lua)
KEYS[12] host_next HASH   (lib/lanes.lua)
KEYS[13] host_delay HASH  lane -> Crawl-delay (s) learned from robots.txt
KEYS[14] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[15] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[16] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  cursor        "0" to start a pass, else the cursor the last step returned
ARGV[3]  limit         COUNT of the step's scan (bounds the call's work)
ARGV[4]  timeout_ms    a worker silent for longer is dead
ARGV[5]  max_requeues  a lease requeued more often goes to the dead letters
ARGV[6]  concurrency   most requests of one lane in flight fleet-wide
ARGV[7]  rest_ms       how long a requeued request's lane rests, at least its
                       Crawl-delay (as requeue_stale.lua)
ARGV[8 ..]             pairs: lane, rest (ms) of lanes with a delay of their own

Returns { cursor, requeued, dead_lettered, reindexed, removed, repairs }: the cursor of
the next step ("0" when the pass is done), in-flight entries requeued, dead-lettered
and re-indexed, index entries removed, and the values of crawl keys repaired
(lib/numbers.lua). Every key's type is checked before the first write.
]]
-- #include clock
-- #include crawl
-- #include lanes
-- #include entry
-- #include requeue
-- #include numbers
-- #include keytypes
local inflight, leases, owned, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue, dead, requeues, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local hosts, busy, backlog, host_next, host_delay = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local record = KEYS[14]
local lane_limits = KEYS[15]
local group_busy = KEYS[16]
local epoch, cursor, limit, timeout_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max_requeues, concurrency, rest_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
local lane_rests = {}
for i = 8, #ARGV - 1, 2 do
    lane_rests[ARGV[i]] = tonumber(ARGV[i + 1])
end
local now_ms = clock_ms()
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, lane_limits,
           group_busy)
entry_init(inflight, leases, owned)
requeue_init(queue, requeues, dead, host_delay, max_requeues, rest_ms, lane_rests)
keys_expect(inflight, "hash", leases, "zset", owned, "zset", workers, "zset", queue, "zset",
            dead, "hash", requeues, "hash", hosts, "zset", busy, "hash", backlog, "hash",
            host_next, "hash", host_delay, "hash")

local counts = { q = 0, d = 0, reindexed = 0, removed = 0 }
local alive = {} -- owner -> whether it heartbeats

local function owner_alive(owner)
    if alive[owner] == nil then
        local beat = redis.call("ZSCORE", workers, owner)
        alive[owner] = beat ~= false and tonumber(beat) >= now_ms - timeout_ms
    end
    return alive[owner]
end

local function check_entry(key, entry)
    local owner = entry_parts(entry)
    if not owner then
        entry_bury_malformed(dead, key, entry)
        counts.d = counts.d + 1
        return
    end
    local owned_member = owner .. "\n" .. key
    local timed = redis.call("ZSCORE", leases, key)
    local listed = redis.call("ZSCORE", owned, owned_member)
    if timed and listed then
        return
    end
    if owner_alive(owner) then
        if not timed then
            redis.call("ZADD", leases, now_ms, key)
        end
        if not listed then
            redis.call("ZADD", owned, 0, owned_member)
        end
        counts.reindexed = counts.reindexed + 1
        return
    end
    local outcome = requeue_lease(key, "in-flight entry of worker " .. owner
                                  .. " without its index entries; the worker stopped heartbeating")
    if outcome ~= "" then
        counts[outcome] = counts[outcome] + 1
    end
end

local function check_lease(key)
    if redis.call("HEXISTS", inflight, key) == 0 then
        redis.call("ZREM", leases, key)
        counts.removed = counts.removed + 1
    end
end

local function check_owned(member)
    local sep = string.find(member, "\n", 1, true)
    local entry = sep and entry_get(string.sub(member, sep + 1))
    if not (entry and string.sub(entry, 1, sep) == string.sub(member, 1, sep)) then
        redis.call("ZREM", owned, member)
        counts.removed = counts.removed + 1
    end
end

-- Phases in order, each with its scan and what it does per element.
local phases = {
    { name = "i", key = inflight, scan = "HSCAN", check = check_entry, next_phase = "l" },
    { name = "l", key = leases, scan = "ZSCAN", check = check_lease, next_phase = "o" },
    { name = "o", key = owned, scan = "ZSCAN", check = check_owned, next_phase = nil },
}
local phase, position = phases[1], "0"
for _, candidate in ipairs(phases) do
    if string.sub(cursor, 1, 1) == candidate.name and string.match(cursor, "^.%d+$") then
        phase, position = candidate, string.sub(cursor, 2)
    end
end

local step = redis.call(phase.scan, phase.key, position, "COUNT", limit)
local found = step[2]
for i = 1, #found, 2 do
    phase.check(found[i], found[i + 1])
end
local next_cursor = phase.name .. step[1]
if step[1] == "0" then
    next_cursor = phase.next_phase and phase.next_phase .. "0" or "0"
end

if counts.q > 0 then
    stats_add(stats, "requeued", counts.q)
end
if counts.d > 0 then
    stats_add(stats, "dead_lettered", counts.d)
end
return { next_cursor, counts.q, counts.d, counts.reindexed, counts.removed, numbers_repairs() }
