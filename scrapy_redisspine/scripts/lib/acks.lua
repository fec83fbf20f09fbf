--[[
acks library: end the leases a worker finished, fenced, and free and rest their lanes:
the acks of enqueue.lua (with the requests and items they carry) and of lease.lua
(acks that carry nothing, sent in the lease's own call: one script call a round trip
instead of two, the same writes in the same order as when they came first in a call
of their own).
Includes entry, batch, lanes, numbers, keytypes, throttle. Needs lanes_init,
throttle_init and acks_init called first (by the script).

acks_init(inflight, leases, owned, requeues)
  inflight  HASH  order key -> owner \n token \n member
  leases    ZSET  order key -> lease time (ms)
  owned     ZSET  score 0, member owner \n order key
  requeues  HASH  order key -> times requeued (an ack ends a request's count)

acks_apply(argv, argv_at, n_acks, owner, item_at, items_due) -> acked, throttled, items_fenced
  argv       the script's ARGV
  argv_at    the index of the first ack; each ack is ACKS_SIZE (7) values: order
             key, lease token, rest (ms) of its lane, n_items (how many items of the
             ARGV's items, from item_at on, are this ack's: groups of 3), download
             latency (ms; -1: no sample), response status (0: none), elapsed (ms
             since its fetch ended; enqueue.lua's "The rest")
  item_at    the ARGV index of the first ack's first item (ignored without items)
  items_due  a list to which the ARGV index of each applied ack's items is added
  acked: acks applied (their lease still carried owner and token); throttled:
  AutoThrottle's samples (lib/throttle.lua); items_fenced: items of acks refused.

Every key an ack touches is read, or its type checked, before its first write; an
ack that does not match (another owner or token, a lease gone, the same key twice)
changes nothing. One HMGET for all entries, one write per key for all of them, one
update per lane (its slots and its rest) however many of its leases end here.
]]
-- #include entry
-- #include batch
-- #include lanes
-- #include numbers
-- #include keytypes
-- #include throttle
local ACKS_SIZE = 7
-- One table, not a local per key: enqueue.lua's main chunk is near Lua's 200 locals.
local acks_keys = {}

local function acks_init(inflight, leases, owned, requeues)
    if not (inflight and leases and owned and requeues) then
        error("acks_init: a key is missing")
    end
    acks_keys.inflight, acks_keys.leases = inflight, leases
    acks_keys.owned, acks_keys.requeues = owned, requeues
end

local function acks_apply(argv, argv_at, n_acks, owner, item_at, items_due)
    if n_acks == 0 then
        return 0, {}, 0
    end
    -- Usually empty: checked once (then one HDEL of the acked keys).
    local any_requeues = key_exists(acks_keys.requeues, "hash")
    keys_expect(acks_keys.leases, "zset", acks_keys.owned, "zset") -- the lanes' HASHes: read below
    local ack_keys = {}
    for i = argv_at, argv_at + ACKS_SIZE * (n_acks - 1), ACKS_SIZE do
        ack_keys[#ack_keys + 1] = argv[i]
    end
    local entries = hmget_in_chunks(acks_keys.inflight, ack_keys)
    local done_keys, done_owned = {}, {}
    local lanes_done, released, freed, rests, samples = {}, {}, {}, {}, {}
    local credits = {} -- lane -> the smallest elapsed (ms) of its acks here
    local items_fenced = 0
    for j, key in ipairs(ack_keys) do
        local base = argv_at + ACKS_SIZE * (j - 1)
        local lane = entry_lane(entries[j], owner, argv[base + 1])
        local its_items = tonumber(argv[base + 3])
        if lane ~= nil and not released[key] then
            released[key] = true
            for i = item_at, item_at + 3 * (its_items - 1), 3 do
                items_due[#items_due + 1] = i
            end
            done_keys[#done_keys + 1] = key
            done_owned[#done_owned + 1] = owner .. "\n" .. key
            if lane then
                if not freed[lane] then
                    lanes_done[#lanes_done + 1] = lane
                    freed[lane], rests[lane] = 0, 0
                end
                freed[lane] = freed[lane] - 1
                local rest = tonumber(argv[base + 2])
                local elapsed = tonumber(argv[base + 6])
                if not (elapsed and elapsed >= 0 and elapsed < math.huge) then
                    numbers_note("ack", key, argv[base + 6], "0 (elapsed)")
                    elapsed = 0
                end
                rests[lane] = math.max(rests[lane], rest - math.min(elapsed, rest))
                credits[lane] = math.min(credits[lane] or elapsed, elapsed)
                local latency = tonumber(argv[base + 4])
                if throttle_on() and latency and latency >= 0 then
                    samples[lane] = samples[lane] or {}
                    table.insert(samples[lane], { latency, tonumber(argv[base + 5]) or 0 })
                end
            end
        else
            items_fenced = items_fenced + its_items
        end
        item_at = item_at + 3 * its_items
    end
    local throttled = {}
    if #done_keys > 0 then
        local lanes_before = lanes_read(lanes_done) -- before the first write
        local delays_before = throttle_read(lanes_done)
        call_in_chunks("HDEL", acks_keys.inflight, done_keys) -- no "denyoom" command: see lease.lua
        call_in_chunks("ZREM", acks_keys.leases, done_keys)
        call_in_chunks("ZREM", acks_keys.owned, done_owned)
        if any_requeues then
            call_in_chunks("HDEL", acks_keys.requeues, done_keys)
        end
        throttled = throttle_write(lanes_done, delays_before, samples, rests, credits)
        lanes_write(lanes_done, lanes_before, freed, nil, rests, false)
    end
    return #done_keys, throttled, items_fenced
end
