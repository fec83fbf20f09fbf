--[[
requeue_stale: return the leases of workers that stopped heartbeating, and leases
older than an absolute ceiling, to the queue. Any worker may run it at any time,
several at once: each lease is requeued once (the first sweep removes it from
in-flight, later ones find nothing), and never after it was acked.

Costs O(stale): dead workers come from the heartbeat ZSET by score, their leases
from the `owned` index by lex range, old leases from `leases` by score.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)
KEYS[2]  owned     ZSET   score 0, member owner \n order key
KEYS[3]  inflight  HASH   order key -> owner \n token \n member
KEYS[4]  leases    ZSET   order key -> lease time (ms)
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
ARGV[2]  timeout_ms    a worker silent for longer is dead
ARGV[3]  ceiling_ms    a lease older than this is requeued even if its owner lives
                       (0: no ceiling)
ARGV[4]  max_requeues  a lease requeued more often goes to the dead letters
ARGV[5]  limit         most leases handled in one call (bounds the call's time)
ARGV[6]  concurrency   most requests of one lane in flight fleet-wide
ARGV[7]  rest_ms       how long a requeued request's lane rests (the dead worker
                       may have been fetching from it), at least its Crawl-delay
ARGV[8]  sweeper       the sweeping worker's id ("": a tool). A sweeper whose own
                       heartbeat is older than the timeout was frozen with the
                       others (Redis itself stalled, or the sweeper did): nobody is
                       taken for dead then, and the call changes nothing
ARGV[9]  remove       "1": a dead worker whose leases were all taken leaves
                       `workers`. "0" (a shard of a sharded crawl): it stays listed,
                       since its leases in the other shards are still to be swept
                       (sharded.py removes it once every shard took them)
ARGV[10 ..]            pairs: lane, rest (ms) of lanes with a delay of their own

Returns { requeued, dead_lettered, workers_removed, repairs, swept }: repairs lists
the values of crawl keys repaired (lib/numbers.lua); swept, the dead workers whose
leases (here) were all taken, removed from `workers` or not. Every key's type is
checked before the first write.
]]
-- #include clock
-- #include crawl
-- #include lanes
-- #include entry
-- #include requeue
-- #include numbers
-- #include keytypes
local workers, owned, inflight, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue, dead, requeues, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local epoch, timeout_ms, ceiling_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local max_requeues, limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local concurrency, rest_ms = tonumber(ARGV[6]), tonumber(ARGV[7])
local hosts, busy, backlog, host_next, host_delay = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local record = KEYS[14]
local lane_limits = KEYS[15]
local group_busy = KEYS[16]
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
local sweeper, remove = ARGV[8], ARGV[9]
local lane_rests = {}
for i = 10, #ARGV - 1, 2 do
    lane_rests[ARGV[i]] = tonumber(ARGV[i + 1])
end
local now_ms = clock_ms()
if sweeper ~= "" then
    local own = tonumber(redis.call("ZSCORE", workers, sweeper) or "")
    if own and own > 0 and own < now_ms - timeout_ms then
        return { 0, 0, 0, {}, {} } -- a stall, not deaths: every heartbeat is old
    end
end
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, lane_limits,
           group_busy)
entry_init(inflight, leases, owned)
keys_expect(workers, "zset", owned, "zset", inflight, "hash", leases, "zset", queue, "zset",
            dead, "hash", requeues, "hash", hosts, "zset", busy, "hash", backlog, "hash",
            host_next, "hash", host_delay, "hash")
requeue_init(queue, requeues, dead, host_delay, max_requeues, rest_ms, lane_rests)
local counts = { q = 0, d = 0 }
local budget = limit
local removed, swept = 0, {}

local function handle(key, reason, owner)
    local outcome = requeue_lease(key, reason, owner)
    if outcome ~= "" then
        counts[outcome] = counts[outcome] + 1
    end
    budget = budget - 1
end

local stale = redis.call("ZRANGEBYSCORE", workers, "-inf", "(" .. (now_ms - timeout_ms),
                         "LIMIT", 0, limit)
for _, worker in ipairs(stale) do
    if budget <= 0 then
        break
    end
    -- "\n" is byte 10: every member "worker\n..." sorts below "worker\v".
    local held = redis.call("ZRANGEBYLEX", owned, "[" .. worker .. "\n", "(" .. worker .. "\v",
                            "LIMIT", 0, budget)
    for _, member in ipairs(held) do
        handle(string.sub(member, #worker + 2), "worker " .. worker .. " stopped heartbeating",
               worker)
    end
    if budget > 0 then
        swept[#swept + 1] = worker
        if remove == "1" then
            redis.call("ZREM", workers, worker)
            removed = removed + 1
        end
    elseif #held > 0 then
        -- Only part of its leases were taken: the next sweep goes on with the rest,
        -- and score 0 tells the worker, should it beat again, that it was swept.
        redis.call("ZADD", workers, 0, worker)
    end
end

if ceiling_ms > 0 and budget > 0 then
    local old = redis.call("ZRANGEBYSCORE", leases, "-inf", "(" .. (now_ms - ceiling_ms),
                           "LIMIT", 0, budget)
    for _, key in ipairs(old) do
        handle(key, "lease older than " .. ceiling_ms .. " ms")
    end
end

if counts.q > 0 then
    stats_add(stats, "requeued", counts.q)
end
if counts.d > 0 then
    stats_add(stats, "dead_lettered", counts.d)
end
return { counts.q, counts.d, removed, numbers_repairs(), swept }
