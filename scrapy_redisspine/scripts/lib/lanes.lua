--[[
lanes library: fleet-wide politeness bookkeeping, for any number of lanes in a fixed
number of calls (three HMGETs, then at most one write per key and kind) however many
lanes a lease, an ack batch or an enqueue batch touches; the single-lane helpers at
the end use the same code.
Includes batch, numbers, lists, hashed. Needs lanes_init called first (by the script).

lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, limits, group_busy)
  queue        ZSET  the crawl's queue (a lane's requests are one lex range of it)
  hosts        ZSET  lane -> time (ms) it may next be leased; holds exactly the lanes
                     with queued requests and a free slot of this crawl's own
  busy         HASH  lane -> this crawl's requests in flight fleet-wide
  backlog      HASH  lane -> requests queued
  host_next    HASH  lane -> earliest time (ms) of its next fetch (end of the last
                     fetch + delay, or a Retry-After block); the politeness group's
  concurrency  number, most requests of one lane in flight fleet-wide
  now_ms       number, the script's clock_ms() (one reading per script call)
  limits       HASH  lane -> its own most in flight (Scrapy's DOWNLOAD_SLOTS), instead
                     of concurrency; read only when it exists (usually it does not)
  group_busy   HASH  lane -> the politeness group's requests in flight: every change
                     of `busy` is made to it too, so it is the sum over the group's
                     crawls (lease.lua checks it before it takes a slot)

Politeness groups. host_next and group_busy are shared by the crawls of a group;
hosts and busy are this crawl's. A lane's time in `hosts` is therefore only a lower
bound: another crawl may have fetched the lane since (host_next moved) or hold its
slots (group_busy full), and its ack cannot write this crawl's `hosts`. lease.lua
checks both for each due lane and moves the lane to its real time, or to a short
re-check when the slots are held elsewhere; here a lane is due or not by this crawl's
own count, as with a single crawl.

lanes_limit_of(lanes) -> lane -> most requests of that lane in flight fleet-wide

lanes_update(lanes, d_busy, d_backlog, rests, nx)
  lanes      the distinct lanes touched, in the order to handle them
  d_busy     lane -> change of its in-flight count (+n leased, -n released), or nil
  d_backlog  lane -> change of its queued count (+n enqueued, -n leased), or nil
  rests      lane -> ms the lane rests from now (a fetch ended), or nil: no fetch
  nx         true: a lane already in `hosts` keeps its time and its place (new
             requests only add lanes that were not due yet)
  Call it after the script changed the lanes' requests in `queue`.
lanes_read(lanes) -> what lanes_update reads (one HMGET per HASH), and
lanes_write(lanes, read, d_busy, d_backlog, rests, nx) -> the rest of it: a script
  that must read everything before its first write reads the lanes early, writes
  other keys, then writes the lanes (after its changes to `queue`).
lanes_read_known(lanes, busy_of, next_of, limit_of, group_of) -> the same as
  lanes_read, from values the caller read itself (only backlog is read).
lane_queued(lane) -> the lane's count in backlog (recounted from the queue, and
  rewritten, if it holds no count).

A lane's time in `hosts` is its next time, or the time it became free if that is
later: lanes due at once are served in the order they were freed. Only a rest that
ends in the future is written to host_next.

A count or time that is no number (lib/numbers.lua) is repaired here, recorded, and
the lane goes on: a busy count is taken as absent (0: it heals as the lane's leases
end, never below 0), a backlog count is counted again from the queue (exact; the
queue is as the script left it, so no change is added), a next time is taken as
absent (the lane is due).
]]
-- #include batch
-- #include numbers
-- #include lists
-- #include hashed
-- Kept in upvalues: read on every lane of every batch, cheaper than a table's fields.
local lanes_queue, lanes_hosts, lanes_busy, lanes_backlog, lanes_next
local lanes_concurrency, lanes_now, lanes_limits, lanes_group_busy

local function lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, limits,
                          group_busy)
    if not (queue and hosts and busy and backlog and host_next and concurrency and now_ms
            and limits and group_busy) then
        error("lanes_init: a key or number is missing")
    end
    lanes_queue, lanes_hosts, lanes_busy, lanes_backlog = queue, hosts, busy, backlog
    lanes_next, lanes_concurrency, lanes_now = host_next, concurrency, now_ms
    lanes_group_busy = group_busy
    -- Usually no lane has a limit of its own: then no HMGET of it per batch.
    lanes_limits = redis.call("EXISTS", limits) == 1 and limits or nil
end

local function lanes_limit_of(lanes)
    local limit_of = {}
    local raw = lanes_limits and #lanes > 0 and hmget_in_chunks(lanes_limits, lanes) or {}
    for i, lane in ipairs(lanes) do
        local limit = count_of(raw[i])
        limit_of[lane] = (limit and limit > 0) and limit or lanes_concurrency
    end
    return limit_of
end

local function lane_queued(lane)
    local raw = redis.call("HGET", lanes_backlog, lane)
    local queued = count_of(raw)
    if not queued then
        queued = lists_lane_count(lanes_queue, lane)
        redis.call("HSET", lanes_backlog, lane, queued)
        numbers_note(lanes_backlog, lane, raw, queued .. " (counted again)")
    end
    return queued
end

local function lanes_read(lanes)
    return { hmget_in_chunks(lanes_busy, lanes), hmget_in_chunks(lanes_backlog, lanes),
             hmget_in_chunks(lanes_next, lanes), lanes_limit_of(lanes),
             hmget_in_chunks(lanes_group_busy, lanes) }
end

-- lanes_read for a caller that read the lanes' busy, host_next and group_busy values
-- (arrays in the order of `lanes`, HMGET's replies) and limits itself, with nothing
-- written to them since (lease.lua's pick): only backlog is read.
local function lanes_read_known(lanes, busy_of, next_of, limit_of, group_of)
    return { busy_of, hmget_in_chunks(lanes_backlog, lanes), next_of, limit_of, group_of }
end

-- The group's count follows the crawl's: the same change, repaired the same way (a
-- count that is no number is taken as absent), never below 0.
local function group_count(lane, raw, change, set, del)
    local in_flight = count_of(raw)
    if not in_flight then
        numbers_note(lanes_group_busy, lane, raw, "absent")
        in_flight, change = 0, change or 0
    end
    if change then
        in_flight = math.max(in_flight + change, 0)
        if in_flight > 0 then
            set[#set + 1] = lane
            set[#set + 1] = in_flight
        else
            del[#del + 1] = lane
        end
    end
end

local function lanes_write(lanes, read, d_busy, d_backlog, rests, nx)
    local busy_of, backlog_of, next_of, limit_of = read[1], read[2], read[3], read[4]
    local group_of = read[5]
    local busy_set, busy_del, backlog_set, backlog_del = {}, {}, {}, {}
    local next_set, next_del, due, not_due = {}, {}, {}, {}
    local group_set, group_del = {}, {}
    for i, lane in ipairs(lanes) do
        local busy_change = d_busy and d_busy[lane]
        local backlog_change = d_backlog and d_backlog[lane]
        group_count(lane, group_of[i], busy_change, group_set, group_del)
        local in_flight = count_of(busy_of[i])
        if not in_flight then
            numbers_note(lanes_busy, lane, busy_of[i], "absent")
            in_flight, busy_change = 0, busy_change or 0
        end
        in_flight = in_flight + (busy_change or 0)
        local queued = count_of(backlog_of[i])
        if queued then
            queued = queued + (backlog_change or 0)
        else
            queued = lists_lane_count(lanes_queue, lane)
            numbers_note(lanes_backlog, lane, backlog_of[i], queued .. " (counted again)")
            backlog_change = 0
        end
        local next_at = time_of(next_of[i])
        if not next_at then
            numbers_note(lanes_next, lane, next_of[i], "absent")
            next_at = 0
            next_del[#next_del + 1] = lane -- unless a rest below writes it
        end
        local rest = rests and rests[lane]
        if rest and lanes_now + rest > next_at then
            next_at = lanes_now + rest
            if rest > 0 then
                next_set[#next_set + 1] = lane
                next_set[#next_set + 1] = next_at
            end
        end
        if busy_change then
            if in_flight > 0 then
                busy_set[#busy_set + 1] = lane
                busy_set[#busy_set + 1] = in_flight
            else
                busy_del[#busy_del + 1] = lane
            end
        end
        if queued > 0 then
            if backlog_change then
                backlog_set[#backlog_set + 1] = lane
                backlog_set[#backlog_set + 1] = queued
            end
            if in_flight >= limit_of[lane] then
                -- The release of a slot puts it back. With nx (new requests only) a
                -- lane already due stays: this caller's concurrency (a push from
                -- outside the crawl, say) may not be the crawl's.
                if not nx then
                    not_due[#not_due + 1] = lane
                end
            else
                due[#due + 1] = next_at
                due[#due + 1] = lane
            end
        else
            backlog_del[#backlog_del + 1] = lane
            not_due[#not_due + 1] = lane
        end
    end
    call_in_chunks("HSET", lanes_busy, busy_set)
    call_in_chunks("HDEL", lanes_busy, busy_del)
    call_in_chunks("HSET", lanes_group_busy, group_set)
    call_in_chunks("HDEL", lanes_group_busy, group_del)
    call_in_chunks("HSET", lanes_backlog, backlog_set)
    call_in_chunks("HDEL", lanes_backlog, backlog_del)
    call_in_chunks("HDEL", lanes_next, next_del) -- before HSET: a lane may be in both
    call_in_chunks("HSET", lanes_next, next_set)
    call_in_chunks("ZREM", lanes_hosts, not_due)
    call_in_chunks("ZADD", lanes_hosts, due, nx and "NX" or nil)
    -- Keys a write may have grown past a packed list's worth (lib/hashed.lua).
    hashed_keep(lanes_busy, "hash", #busy_set)
    hashed_keep(lanes_group_busy, "hash", #group_set)
    hashed_keep(lanes_backlog, "hash", #backlog_set)
    hashed_keep(lanes_next, "hash", #next_set)
    hashed_keep(lanes_hosts, "zset", #due)
end

local function lanes_update(lanes, d_busy, d_backlog, rests, nx)
    if #lanes > 0 then
        lanes_write(lanes, lanes_read(lanes), d_busy, d_backlog, rests, nx)
    end
end

-- The same for one lane (the cold paths: release, bury, requeue, reinject, repair).
-- Put the lane in `hosts` at its next time, or take it out, as its counts say.
local function host_schedule(lane)
    lanes_update({ lane }, nil, nil, nil, false)
end

-- A request entered the queue (it was not there: a lane already due keeps its turn).
local function host_enqueued(lane)
    lanes_update({ lane }, nil, { [lane] = 1 }, nil, true)
end

-- A request of the lane left in-flight: rest_ms as in lanes_update (nil: no fetch);
-- requeued: it went back to the queue.
local function host_released(lane, rest_ms, requeued)
    lanes_update({ lane }, { [lane] = -1 }, requeued and { [lane] = 1 } or nil,
                 rest_ms and { [lane] = rest_ms } or nil, false)
end
