--[[
enqueue: add discovered requests to the frontier and ack the requests whose
processing discovered them, in one atomic step.

Doing both at once is what makes termination safe: there is no moment at which
a parent has left in-flight while its children are not yet queued.

KEYS[1]  queue     ZSET   score = -priority, member = order key .. payload
KEYS[2]  seq       STRING counter behind the order keys
KEYS[3]  seen      SET    raw request fingerprints (fleet-wide dedup)
KEYS[4]  starts    SET    raw fingerprints of start requests (once per crawl)
KEYS[5]  inflight  HASH   order key -> owner \n score \n member
KEYS[6]  leases    ZSET   order key -> lease time (ms)
KEYS[7]  stats     HASH   fleet-wide counters
KEYS[8]  dedup     HASH   dedup mode and Bloom filter parameters (lib/dedup.lua)
KEYS[9]  bloom     STRING Bloom filter bitmap (lib/dedup.lua)

ARGV[1]  order     "fifo" or "lifo"
ARGV[2]  owner     worker id; only its own leases are acked
ARGV[3]  n_acks    number of order keys to ack that follow
ARGV[4 .. 3+n_acks]        order keys to ack
ARGV[4+n_acks ..]          groups of 4: flags, fingerprint, score, payload
           flags: "f" check `seen`, "s" check `starts`, both, or "-" for none

Returns { statuses, acked }: statuses has one character per request,
"+" enqueued, "d" duplicate (seen), "s" start request already injected;
acked counts the acks that matched a lease of this owner.
]]
local queue, seq, starts = KEYS[1], KEYS[2], KEYS[4]
local inflight, leases, stats = KEYS[5], KEYS[6], KEYS[7]
local dedup_seen, dedup_meta, dedup_bloom = KEYS[3], KEYS[8], KEYS[9]
-- #include dedup
local order, owner = ARGV[1], ARGV[2]
local n_acks = tonumber(ARGV[3])
local first_request = 4 + n_acks

local owner_prefix = owner .. "\n"
local acked = 0
for i = 4, 3 + n_acks do
    local entry = redis.call("HGET", inflight, ARGV[i])
    if entry and string.sub(entry, 1, #owner_prefix) == owner_prefix then
        redis.call("HDEL", inflight, ARGV[i])
        redis.call("ZREM", leases, ARGV[i])
        acked = acked + 1
    end
end

local n_requests = (#ARGV - first_request + 1) / 4
local statuses = {}
local to_add = {}
for i = 0, n_requests - 1 do
    local base = first_request + 4 * i
    local flags, fingerprint = ARGV[base], ARGV[base + 1]
    local status = "+"
    if string.find(flags, "s", 1, true) and redis.call("SADD", starts, fingerprint) == 0 then
        status = "s"
    elseif string.find(flags, "f", 1, true) and dedup_add(fingerprint) == 0 then
        status = "d"
    end
    statuses[#statuses + 1] = status
    if status == "+" then
        to_add[#to_add + 1] = base
    end
end

if #to_add > 0 then
    local last = redis.call("INCRBY", seq, #to_add)
    local first = last - #to_add + 1
    for j, base in ipairs(to_add) do
        local n = first + j - 1
        if order == "lifo" then
            n = 999999999999999 - n
        end
        local key = string.format("%015d", n)
        redis.call("ZADD", queue, ARGV[base + 2], key .. ARGV[base + 3])
    end
    redis.call("HINCRBY", stats, "enqueued", #to_add)
end
local filtered = n_requests - #to_add
if filtered > 0 then
    redis.call("HINCRBY", stats, "filtered", filtered)
end
if acked > 0 then
    redis.call("HINCRBY", stats, "acked", acked)
end
return { table.concat(statuses), acked }
