--[[
lease: hand a worker up to `count` requests, one per free slot of each due lane, recording
each in in-flight in the same atomic step (a request is always either queued or
leased) and taking its lane's slot, so that at most `concurrency` requests of a
lane are in flight fleet-wide and a lane rests between fetches (lib/lanes.lua).
Due lanes come oldest-due first: a lane with a million queued requests gets one
slot per turn like any other.

Each lease carries a fencing token (one number per lease call, from `seq`): acks,
releases and burials must present it, so a worker presumed dead cannot touch a
lease that was requeued in the meantime.

A member that has no lane or no 15-digit order key, or whose key is already
leased, was not written by enqueue: it goes to the dead letters (under a fresh
field). Members no lane can reach (queue not empty, no lane scheduled, nothing in
flight) are re-scheduled or dead-lettered here too, so garbage never stalls a crawl.

KEYS[1]  queue     ZSET   score 0, member = lane \0 priority key order key payload, or
                          the index entry of a lane's list (lib/lists.lua)
KEYS[2]  inflight  HASH   order key -> owner \n token \n member
KEYS[3]  leases    ZSET   order key -> lease time (ms, Redis TIME)
KEYS[4]  stats     HASH   fleet-wide counters
KEYS[5]  dead      HASH   dead letters: field -> reason \n member
KEYS[6]  seq       STRING counter: fencing tokens, dead letters' field numbers
KEYS[7]  owned     ZSET   score 0, member owner \n order key (leases by owner)
KEYS[8]  requeues  HASH   order key -> times requeued
KEYS[9]  hosts     ZSET   lane -> next lease time (ms)        (lib/lanes.lua)
KEYS[10] busy      HASH   lane -> requests in flight          (lib/lanes.lua)
KEYS[11] backlog   HASH   lane -> requests queued             (lib/lanes.lua)
KEYS[12] host_next HASH   lane -> earliest next fetch (ms)    (lib/lanes.lua)
KEYS[13] host_delay HASH  lane -> Crawl-delay (s) learned from robots.txt
KEYS[14] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[15] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[16] control  HASH   fleet orders; field close_reason: a fleet-wide limit was hit
KEYS[17] lane_pages HASH  lane -> requests leased (REDISSPINE_HOST_PAGE_LIMIT's count)
KEYS[18] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)
KEYS[19] lane_throttle HASH lane -> its AutoThrottle delay (ms; lib/throttle.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  owner        worker id
ARGV[3]  count        most requests to lease (>= 0)
ARGV[4]  concurrency  most requests of one lane in flight fleet-wide
ARGV[5]  page_budget  most requests the crawl leases in all (Scrapy's
                      CLOSESPIDER_PAGECOUNT, fleet-wide; 0: no budget)
ARGV[6]  lane_page_limit  most requests one lane leases in all (REDISSPINE_HOST_PAGE_LIMIT,
                      fleet-wide; 0: no limit, and lane_pages is not written)
ARGV[7]  recheck_ms   when a due lane's slots are all held by other crawls of the
                      politeness group: in how many ms to look at it again
ARGV[8]  n_acks       number of acks that follow (acks that carry no items)
ARGV[9 .. 12]         AutoThrottle: target concurrency (0: off), start, min and max
                      delay (ms), as enqueue.lua's ARGV[10 .. 13]
ARGV[13 ..]           the acks, groups of 7 as in enqueue.lua (n_items always 0)

Acks. A worker whose finished requests yielded nothing to queue (a leaf page, or
only links it knew were seen) sends their acks here, not in an enqueue call of
their own: they are applied first (lib/acks.lua), exactly as enqueue.lua applies
them, so their lanes are free (and resting) before this lease looks for due lanes,
and a round trip costs Redis one script call instead of two.

Politeness groups (lib/lanes.lua): a lane's slots (group_busy) and rest (host_next)
are shared by the crawls of a group; `hosts` and `busy` are this crawl's. A due lane
whose group rest is not over moves to the end of that rest; one whose slots are all
held by other crawls moves recheck_ms ahead (their acks cannot reach this crawl's
`hosts`); neither is leased, and neither is due again before that time, so no worker
spins on it. A lane whose slots this crawl holds itself leaves `hosts` as before
(its own ack puts it back).

Fleet-wide limits (limits.py): with a close order in `control` nothing is leased;
with a page budget, at most what is left of it: the crawl's `leased` counter counts
every fetch (a requeued request fetched again counts again, as Scrapy counts each
response). The call that finds the budget spent sets the close order
`closespider_pagecount`, so every worker closes with Scrapy's own reason.

Per-lane page limit: a lane leases at most lane_page_limit requests in all (counted
in lane_pages like `leased`: a request fetched again after its worker died counts
again; one put back unfetched, by release or release_orphans, gives its page
back). When a due lane has spent its limit, its queued requests leave the queue
here, its backlog count goes with them, and the stats HASH counts them in
`host_page_limited`: a budget the user set, not a loss (the crawl still finishes).
A count that is no number is dropped and repaired (lib/numbers.lua): the lane
starts again from 0.

Returns { members, token, requeued, delays, queued, inflight, malformed, wait_ms,
close_reason, repairs, page_limited, acked, throttled }: the leased queue members,
their fencing token, how often each was requeued before, each lane's learned
Crawl-delay ("" if none; else a number as text), how many requests stay queued and
in flight fleet-wide, how many malformed members went to the dead letters, in how
many ms the next lane becomes due (-1: none scheduled), the fleet's close order (""
if none), the values of crawl keys repaired (lib/numbers.lua), how many queued
requests the per-lane page limit dropped (lib/pagelimit.lua), how many of the acks
were applied and their AutoThrottle samples (enqueue.lua's acked and throttled). The
arrays members, requeued and delays always have the same length.

Every key is read, or its type checked (lib/keytypes.lua), before the writes that
lease: a key of the wrong type fails the script before a request left the queue.
Only bookkeeping that is right on its own may come first (the acks, which are
checked the same way before their own writes; a lane's schedule fixed, a malformed
member dead-lettered).
]]
-- #include clock
-- #include crawl
-- #include member
-- #include batch
-- #include lists
-- #include lanes
-- #include numbers
-- #include keytypes
-- #include pagelimit
-- #include group
-- #include hashed
-- #include acks
-- #include throttle
local queue, inflight, leases, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, seq, owned, requeues = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local hosts, busy, backlog, host_next, host_delay = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local record = KEYS[14]
local lane_limits, control, lane_pages = KEYS[15], KEYS[16], KEYS[17]
local group_busy = KEYS[18]
local lane_throttle = KEYS[19]
local epoch, owner, count, concurrency = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local page_budget, lane_page_limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local recheck_ms = tonumber(ARGV[7])
local n_acks = tonumber(ARGV[8])
local FIRST_ACK = 13
throttle_init(lane_throttle, tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]),
              tonumber(ARGV[12]))
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
local close_reason = redis.call("HGET", control, "close_reason") or ""
if close_reason == "" and page_budget > 0 and count > 0 then
    local counted = redis.pcall("HGET", stats, "leased") -- (any type: numbers.lua)
    local left = page_budget - (type(counted) == "string" and tonumber(counted) or 0)
    if left <= 0 then
        close_reason = "closespider_pagecount"
        redis.call("HSET", control, "close_reason", close_reason)
    else
        count = math.min(count, left)
    end
end
if close_reason ~= "" then
    count = 0
end
local now_ms = clock_ms()
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, now_ms, lane_limits,
           group_busy)
acks_init(inflight, leases, owned, requeues)
for i = FIRST_ACK + 3, FIRST_ACK + ACKS_SIZE * n_acks - 1, ACKS_SIZE do
    if ARGV[i] ~= "0" then
        error("lease: an ack sent with a lease carries no items (enqueue.lua takes those)")
    end
end
local acked, throttled = acks_apply(ARGV, FIRST_ACK, n_acks, owner, #ARGV + 1, {})

local members, requeued, delays = {}, {}, {}
-- Usually both are empty: checked once per call (then one HMGET each, see below).
local any_requeues = count > 0 and key_exists(requeues, "hash")
local any_delays = count > 0 and key_exists(host_delay, "hash")
local malformed = 0
local token = 0
local dead_checked = false
local pages_of = {} -- lane -> requests it leased before this call (with a page limit)
local spent = {} -- due lanes whose page limit is spent: their queue is dropped
local page_limited = 0

local function bury_malformed(member)
    if not dead_checked then
        key_exists(dead, "hash") -- before the ZREM: the member must land somewhere
        dead_checked = true
    end
    redis.call("ZREM", queue, member)
    local field = "malformed:" .. seq_take(seq, 1)
    redis.call("HSET", dead, field, "malformed queue member\n" .. member)
    malformed = malformed + 1
end

-- Leasing goes in phases so that each kind of write is one call for the whole batch
-- (lib/batch.lua, lib/lanes.lua): pick candidates lane by lane, check their keys
-- with one HMGET, then write.
-- Lanes the group holds back: score, lane pairs for `hosts`, written after the
-- lease's ZREM (move_held_lanes).
local held_back = {}

-- Whether the group lets the lane lease now; if not, the lane is to move to the time
-- it may (its group rest's end, or a re-check while other crawls hold its slots).
local function group_allows(lane, own, group, limit, next_raw)
    local next_at = time_of(next_raw) or 0 -- no number: lanes_write repairs it
    if next_at > now_ms then
        held_back[#held_back + 1] = next_at
    elseif group >= limit and own < limit then
        held_back[#held_back + 1] = now_ms + recheck_ms
    else
        return true
    end
    held_back[#held_back + 1] = lane
    return false
end

-- ZADD may be refused on a full Redis (it is "denyoom", and when nothing was leased
-- it is this call's first write, which Redis checks): then the lanes stay due and
-- are checked again at the next lease, which must not fail for it. The counter is
-- tried the same way (it fails exactly when nothing can be written).
local function move_held_lanes()
    if #held_back == 0 then
        return
    end
    local moved = redis.pcall("ZADD", hosts, "XX", unpack(held_back))
    if type(moved) == "table" and moved.err then
        redis.pcall("HINCRBY", stats, "group_recheck_refused", 1)
    end
end

-- An index entry whose list is gone (deleted by hand) or holds another type: the
-- entry leaves the queue, the counts are counted again, and the repair is recorded
-- (the worker logs and counts it): its requests are lost, never taken in silence.
local broken = {} -- lanes to count again
local drained = {} -- index entry -> true: this lease takes its list's last request
local function drop_broken_list(lane, entry, reason)
    redis.call("ZREM", queue, entry)
    numbers_note(lists_key(queue, entry), "-", nil, "index entry removed", reason)
    lists_recount(queue, "(a list of the queue was lost)")
    broken[#broken + 1] = lane
end

-- pick's reads of the due lanes, for lease_picked's lanes_write: nothing writes a
-- picked lane's busy, group_busy, host_next or limit in between (a lane pick
-- schedules or drops is not picked), so only its backlog is read again.
local due_at, due_busy, due_group, due_next, due_limit = {}, nil, nil, nil, nil

local function pick(due)
    local picked = {} -- { lane, member } in lease order
    local busy_of = hmget_in_chunks(busy, due)
    local group_of = hmget_in_chunks(group_busy, due)
    local next_of = hmget_in_chunks(host_next, due)
    local limit_of = lanes_limit_of(due)
    due_busy, due_group, due_next, due_limit = busy_of, group_of, next_of, limit_of
    for i, lane in ipairs(due) do
        due_at[lane] = i
    end
    if lane_page_limit > 0 then
        pages_of = page_limit_read(lane_pages, due)
    end
    for i, lane in ipairs(due) do
        if count <= #picked then
            break
        end
        -- A busy count that is no count: lanes_write repairs it (this lane gets there).
        local own = count_of(busy_of[i]) or 0
        local group = math.max(count_of(group_of[i]) or 0, own)
        local want = math.min(limit_of[lane] - group, count - #picked)
        if lane_page_limit > 0 then
            want = math.min(want, lane_page_limit - pages_of[lane])
        end
        if lane_page_limit > 0 and pages_of[lane] >= lane_page_limit then
            spent[#spent + 1] = lane
        elseif not group_allows(lane, own, group, limit_of[lane], next_of[i]) then
            -- not now: moved to its time in `hosts`
        elseif want <= 0 then
            host_schedule(lane) -- workers disagree on the concurrency: wait for a slot
        else
            local low, high = lane_range(lane)
            local firsts = redis.call("ZRANGEBYLEX", queue, low, high, "LIMIT", 0, want)
            if #firsts == 0 then
                redis.call("HDEL", backlog, lane) -- the count was off: nothing queued
                host_schedule(lane)
            end
            local got = 0
            for _, first in ipairs(firsts) do
                if got >= want then
                    break
                end
                local _, priority_key = lists_entry_parts(first)
                if priority_key then
                    -- an index entry: the list's first requests, in its order, and
                    -- one more to know if the list is left empty (no LLEN later)
                    local n = want - got
                    local payloads, reason = lists_read(queue, first, n + 1)
                    if payloads and #payloads > 0 then
                        drained[first] = #payloads <= n or nil
                        for j = 1, math.min(#payloads, n) do
                            picked[#picked + 1] = { lane, false, priority_key, payloads[j], first }
                        end
                        got = got + math.min(#payloads, n)
                    else
                        drop_broken_list(lane, first, reason or "(no list)")
                    end
                else
                    picked[#picked + 1] = { lane, first }
                    got = got + 1
                end
            end
        end
    end
    return picked
end

-- lane -> its Crawl-delay as text, for the lanes that have one; a delay that is no
-- number of seconds is dropped (as if no worker had learned one).
local function lane_delays(lanes)
    local raw, delay_of = hmget_in_chunks(host_delay, lanes), {}
    for j, lane in ipairs(lanes) do
        if raw[j] then
            local seconds = time_of(raw[j])
            if seconds and seconds >= 0 then
                delay_of[lane] = string.format("%.17g", seconds)
            else
                numbers_drop(host_delay, lane, raw[j])
            end
        end
    end
    return delay_of
end

local function lease_picked(picked)
    -- Requests put back as members carry their order key; those taken from a list
    -- get theirs below, from `seq`, after the first write.
    local keys, lanes_of, member_keys, member_at = {}, {}, {}, {}
    for i, pick_ in ipairs(picked) do
        if pick_[2] then
            local lane, key = member_lane(pick_[2])
            keys[i], lanes_of[i] = key or "", lane
            member_keys[#member_keys + 1] = keys[i]
            member_at[i] = #member_keys
        end
    end
    local held = hmget_in_chunks(inflight, member_keys)
    local taken, seen_keys, recount = {}, {}, {}
    for i, pick_ in ipairs(picked) do
        local lane, member, key = pick_[1], pick_[2], keys[i]
        -- A member not written by enqueue: no lane or key, another lane's, or a key
        -- already leased (in flight, or twice in this batch).
        if not member then
            taken[#taken + 1] = i
        elseif lanes_of[i] ~= lane or held[member_at[i]] or seen_keys[key] then
            bury_malformed(member)
            recount[#recount + 1] = lane
        else
            seen_keys[key] = true
            taken[#taken + 1] = i
        end
    end
    if #taken == 0 then
        return recount
    end
    local taken_members, member_taken_keys, lanes, moved, took = {}, {}, {}, {}, {}
    local from_lists, trims, trim_order = 0, {}, {} -- list index entry -> requests taken
    for _, i in ipairs(taken) do
        local lane = picked[i][1]
        if picked[i][2] then
            taken_members[#taken_members + 1] = picked[i][2]
            member_taken_keys[#member_taken_keys + 1] = keys[i]
        else
            local entry = picked[i][5]
            if not trims[entry] then
                trims[entry] = 0
                trim_order[#trim_order + 1] = entry
            end
            trims[entry] = trims[entry] + 1
            from_lists = from_lists + 1
        end
        if not moved[lane] then
            lanes[#lanes + 1] = lane
            moved[lane] = 0
        end
        moved[lane] = moved[lane] + 1
        took[lane] = -moved[lane]
    end
    -- Read before the first write. Usually both hashes are empty (checked once per
    -- call); else one HMGET each. (A key from a list is new: never requeued.)
    local times = any_requeues and hmget_in_chunks(requeues, member_taken_keys) or {}
    local delay_of = any_delays and lane_delays(lanes) or {}
    local busy_before, next_before, group_before = {}, {}, {}
    for k, lane in ipairs(lanes) do
        local i = due_at[lane]
        busy_before[k], next_before[k], group_before[k] = due_busy[i], due_next[i], due_group[i]
    end
    local lanes_before = lanes_read_known(lanes, busy_before, next_before, due_limit, group_before)
    keys_expect(leases, "zset", owned, "zset")
    -- ZREM, LTRIM, UNLINK first: Redis checks maxmemory only before a script's first
    -- write, and none is a "denyoom" command, so leases (which free memory once
    -- acked) still work on a full Redis.
    call_in_chunks("ZREM", queue, taken_members)
    local emptied = {}
    for _, entry in ipairs(trim_order) do
        local key = lists_key(queue, entry)
        if drained[entry] then
            redis.call("UNLINK", key)
            emptied[#emptied + 1] = entry
        else
            redis.call("LTRIM", key, trims[entry], -1)
        end
    end
    call_in_chunks("ZREM", queue, emptied)
    if from_lists > 0 then
        lists_adjust(queue, -from_lists, -#emptied)
    end
    token = seq_take(seq, 1 + from_lists)
    local number = token - from_lists -- the order keys of requests from lists
    local inflight_pairs, lease_pairs, owned_pairs = {}, {}, {}
    local member_j = 0
    for j, i in ipairs(taken) do
        local member, key = picked[i][2], keys[i]
        local before = 0
        if member then
            member_j = member_j + 1
            before = count_of(times[member_j])
            if not before then
                numbers_drop(requeues, key, times[member_j]) -- a fresh budget, not a lost lease
                before = 0
            end
        else
            key = member_order_key(number, false)
            number = number + 1
            member = member_make(picked[i][1], picked[i][3], key, picked[i][4])
        end
        inflight_pairs[#inflight_pairs + 1] = key
        inflight_pairs[#inflight_pairs + 1] = owner .. "\n" .. token .. "\n" .. member
        lease_pairs[#lease_pairs + 1] = now_ms
        lease_pairs[#lease_pairs + 1] = key
        owned_pairs[#owned_pairs + 1] = 0
        owned_pairs[#owned_pairs + 1] = owner .. "\n" .. key
        members[j] = member
        requeued[j] = before
        delays[j] = delay_of[picked[i][1]] or ""
    end
    call_in_chunks("HSET", inflight, inflight_pairs)
    call_in_chunks("ZADD", leases, lease_pairs)
    call_in_chunks("ZADD", owned, owned_pairs)
    hashed_keep(inflight, "hash")
    hashed_keep(leases, "zset")
    hashed_keep(owned, "zset")
    lanes_write(lanes, lanes_before, moved, took, nil, false)
    if lane_page_limit > 0 then
        page_limit_add(lane_pages, lanes, pages_of, moved)
    end
    return recount
end

-- Every member has score 0 (lex ranges need it); one that does not was not written
-- by enqueue and would hide its neighbours from those ranges.
if redis.call("ZCOUNT", queue, "-inf", "(0") + redis.call("ZCOUNT", queue, "(0", "+inf") > 0 then
    for _, bounds in ipairs({ { "-inf", "(0" }, { "(0", "+inf" } }) do
        local odd = redis.call("ZRANGEBYSCORE", queue, bounds[1], bounds[2], "LIMIT", 0, 100)
        for _, member in ipairs(odd) do
            bury_malformed(member)
        end
    end
end

if count > 0 then
    local due = redis.call("ZRANGEBYSCORE", hosts, "-inf", now_ms, "LIMIT", 0, count)
    local recount = lease_picked(pick(due))
    move_held_lanes()
    page_limited = page_limit_drop(queue, backlog, spent)
    for _, lane in ipairs(broken) do
        recount[#recount + 1] = lane
    end
    for _, lane in ipairs(recount) do
        -- A buried member may never have been counted: count the lane again.
        redis.call("HSET", backlog, lane, lists_lane_count(queue, lane))
        host_schedule(lane)
    end
end

-- Repair: members no scheduled lane can reach (garbage, or counts gone wrong). With
-- nothing in flight, every lane's busy count is 0 (absent): one that is not would
-- keep its lane from ever being due.
if #members == 0 and redis.call("ZCARD", hosts) == 0 and redis.call("HLEN", inflight) == 0 then
    local stranded = redis.call("ZRANGE", queue, 0, 99)
    local counted = #stranded > 0 and redis.call("HLEN", busy) or 0
    if counted > 0 then
        group_forget(busy, group_busy) -- the group's other crawls keep their counts
        redis.call("DEL", busy)
        numbers_note(busy, "*", nil, "absent", counted .. " lane count(s) with nothing in flight")
    end
    for _, member in ipairs(stranded) do
        local lane = lists_entry_parts(member) or member_lane(member)
        if lane then
            redis.call("HSET", backlog, lane, lists_lane_count(queue, lane))
            host_schedule(lane)
        else
            bury_malformed(member)
        end
    end
end

if #members > 0 then
    stats_add(stats, "leased", #members)
end
if acked > 0 then
    stats_add(stats, "acked", acked)
end
if malformed > 0 then
    stats_add(stats, "dead_lettered", malformed)
end
if page_limited > 0 then
    stats_add(stats, "host_page_limited", page_limited)
end
local wait_ms = -1
local next_lane = redis.call("ZRANGE", hosts, 0, 0, "WITHSCORES")
if next_lane[2] then
    wait_ms = math.max(tonumber(next_lane[2]) - now_ms, 0)
end
return { members, token, requeued, delays, lists_size(queue),
         redis.call("HLEN", inflight), malformed, wait_ms, close_reason, numbers_repairs(),
         page_limited, acked, throttled }
