--[[
enqueue: add discovered requests to the frontier and ack the requests whose
processing discovered them, in one atomic step.

Doing both at once is what makes termination safe: there is no moment at which
a parent has left in-flight while its children are not yet queued. An ack also
frees the parent's host slot and rests the host (politeness, lib/lanes.lua).

KEYS[1]  queue     ZSET   score 0, member = lane \0 priority key order key payload, or
                          the index entry of a lane's list (lib/lists.lua)
KEYS[2]  seq       STRING counter behind the order keys
KEYS[3]  seen      SET    raw request fingerprints (fleet-wide dedup)
KEYS[4]  starts    SET    raw fingerprints of start requests (once per crawl)
KEYS[5]  inflight  HASH   order key -> owner \n token \n member
KEYS[6]  leases    ZSET   order key -> lease time (ms)
KEYS[7]  stats     HASH   fleet-wide counters
KEYS[8]  dedup     HASH   dedup mode and Bloom filter parameters (lib/dedup.lua)
KEYS[9]  bloom     STRING Bloom filter (lib/dedup.lua)
KEYS[10] owned     ZSET   score 0, member owner \n order key (leases by owner)
KEYS[11] requeues  HASH   order key -> times requeued
KEYS[12] hosts     ZSET   lane -> next lease time (ms)        (lib/lanes.lua)
KEYS[13] busy      HASH   lane -> requests in flight          (lib/lanes.lua)
KEYS[14] backlog   HASH   lane -> requests queued             (lib/lanes.lua)
KEYS[15] host_next HASH   lane -> earliest next fetch (ms)    (lib/lanes.lua)
KEYS[16] record    HASH   the crawl record: writes only while it is the caller's crawl
KEYS[17] lane_limits HASH lane -> its own most in flight (lib/lanes.lua)
KEYS[18] items    STREAM the crawl's items: fields class, url, item (REDISSPINE_ITEMS)
KEYS[19] group_busy HASH  lane -> the politeness group's requests in flight (lib/lanes.lua)
KEYS[20] lane_throttle HASH lane -> its AutoThrottle delay (ms; lib/throttle.lua)

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  order        "fifo" or "lifo"
ARGV[3]  owner        worker id
ARGV[4]  n_acks       number of acks that follow
ARGV[5]  concurrency  most requests of one lane in flight fleet-wide
ARGV[6]  backlog_cap  most requests queued per lane (0: no cap)
ARGV[7]  items_cap    most entries the items stream holds (0: no cap)
ARGV[8]  items_bytes  most bytes of items the stream holds, estimated (0: no cap)
ARGV[9]  n_loose      items that belong to no ack (written unfenced)
ARGV[10] throttle_target    AUTOTHROTTLE_TARGET_CONCURRENCY (0: AutoThrottle off)
ARGV[11] throttle_start_ms  AUTOTHROTTLE_START_DELAY (ms)
ARGV[12] throttle_min_ms    DOWNLOAD_DELAY (ms): the adapted delay never goes below it
ARGV[13] throttle_max_ms    AUTOTHROTTLE_MAX_DELAY (ms)
ARGV[14 .. 13+7*n_acks]    groups of 7: order key, lease token, rest (ms) of its lane,
           n_items (how many of the items that follow are this request's), the
           request's download latency (ms; -1: no sample, e.g. no response or
           autothrottle_dont_adjust_delay), its response's status (0: none) and
           elapsed: how long ago (ms, the worker's monotonic clock) its fetch ended
           (0: count the rest from now; see "The rest" below)
then the items, groups of 3: class, url, payload: the n_loose loose ones first, then
           each ack's n_items, in the order of the acks
then the requests, groups of 5: flags, fingerprint, lane, priority key, payload
           flags: "f" check `seen`, "s" check `starts`, both, or "-" for none

An ack is fenced: it only removes a lease that still carries this owner AND the
token it was leased with. A worker presumed dead whose lease was requeued (and
perhaps leased again, even to itself) can no longer remove it. The items of an ack go
into `items` only when the ack itself is applied, in this same step: a request
fetched twice (its first worker presumed dead, or an ack whose reply was lost and is
sent again) writes its items once, with the ack that wins.

The stream's cap: an item is shed (counted, not written) once the stream holds
items_cap entries, or when its bytes would take the estimated size past items_bytes
(bytes written so far, scaled by the share of entries still in the stream: a
consumer that trims what it processed makes room). A shed item never refuses its
ack: the crawl goes on.

The rest. A lane rests from the end of its fetch, not from the ack: the worker
received the response (its clock starts there) after the site sent it, and the
ack's flight to Redis is not credited, so starting the rest at now - elapsed keeps
every real end -> start gap >= the rest, while the callback, the item pipeline and
the wait for the next lease no longer add to each interval. The credit is capped at
the lane's rest (its delay, its Retry-After block, or its AutoThrottle delay): a
stale ack (after an outage, or reconciled late) makes the lane due now, never
earlier. An elapsed that is no number >= 0 is taken as 0 and recorded as a repair
(lib/numbers.lua: the worker logs and counts it).

AutoThrottle (lib/throttle.lua): with throttle_target > 0, each applied ack's latency
moves its lane's delay in lane_throttle (the politeness group's: every crawl's
samples count), and the lane rests at least that delay after the ack, as after any
fetch with DOWNLOAD_DELAY: the lease then holds the lane back until its rest ends.

Returns { statuses, acked, items_written, items_shed, repairs, throttled }: statuses
has one character per request,
"+" enqueued, "d" duplicate (seen), "s" start request already injected,
"c" dropped: its lane's backlog is at the cap; acked counts the acks that matched;
repairs lists the values of crawl keys repaired (lib/numbers.lua); throttled: flat
{ lane, old delay ms, new delay ms, latency ms, status } per AutoThrottle sample.

A batch of only start requests and dont_filter requests is never refused for lack of
memory (see below); other batches are, unless an ack wrote first (lease.lua).

Every key is read, or its type checked, before the first write: a key of the wrong
type fails the script before an ack is applied or a fingerprint recorded (a
fingerprint recorded for a request that never reached the queue would be lost: its
next copy is a duplicate). Bloom filters of RedisBloom are not checked.
]]
-- #include dedup
-- #include clock
-- #include crawl
-- #include member
-- #include lists
-- #include acks
-- #include batch
-- #include lanes
-- #include numbers
-- #include keytypes
-- #include throttle
-- #include hashed
local queue, seq, starts = KEYS[1], KEYS[2], KEYS[4]
local inflight, leases, stats = KEYS[5], KEYS[6], KEYS[7]
local owned, requeues = KEYS[10], KEYS[11]
local hosts, busy, backlog, host_next = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local seen, dedup, bloom, record = KEYS[3], KEYS[8], KEYS[9], KEYS[16]
local lane_limits, items = KEYS[17], KEYS[18]
local group_busy = KEYS[19]
local lane_throttle = KEYS[20]
local epoch, order, owner = ARGV[1], ARGV[2], ARGV[3]
local n_acks, concurrency, backlog_cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local items_cap, items_bytes, n_loose = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
throttle_init(lane_throttle, tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]),
              tonumber(ARGV[13]))
local FIRST_ACK = 14
local first_item = FIRST_ACK + ACKS_SIZE * n_acks
local n_items = n_loose
for i = FIRST_ACK + 3, first_item - 1, ACKS_SIZE do
    n_items = n_items + tonumber(ARGV[i])
end
local first_request = first_item + 3 * n_items
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
local n_requests = (#ARGV - first_request + 1) / 5
-- First: a corrupt dedup HASH or a key of the wrong type fails before any write (seq
-- is repaired whatever it holds, lib/numbers.lua).
lanes_init(queue, hosts, busy, backlog, host_next, concurrency, clock_ms(), lane_limits,
           group_busy)
acks_init(inflight, leases, owned, requeues)
if n_requests > 0 then
    dedup_init(seen, dedup, bloom) -- (acks alone need no dedup)
    keys_expect(queue, "zset", starts, "set", seen, "set", busy, "hash", backlog, "hash",
                host_next, "hash")
end
if n_acks + n_requests > 0 then
    key_exists(hosts, "zset")
end
if n_items > 0 then
    key_exists(items, "stream")
end

-- Acks (lib/acks.lua): before any other write, so that their lanes are free and
-- resting as the batch's requests are added.
local items_due = {} -- ARGV index of each item to write: loose ones, then applied acks'
for i = first_item, first_item + 3 * (n_loose - 1), 3 do
    items_due[#items_due + 1] = i
end
local acked, throttled, items_fenced = acks_apply(ARGV, FIRST_ACK, n_acks, owner,
                                                  first_item + 3 * n_loose, items_due)

-- Start requests and requests that skip dedup (retries, redirects: dont_filter) are
-- work the crawl already has, not new discoveries: a batch of only those (with items
-- and acks, or nothing else) goes in on a full Redis too. Redis checks maxmemory only
-- before a script's first write, and SREM is no "denyoom" command (nor is "" ever a
-- fingerprint; pcall: a write that fails counts as one, so a key of the wrong type
-- stops nothing here). Without this a worker holding such a batch and no ack that applied would
-- wait for room that may never come.
if acked == 0 then
    local kept_only = true
    for i = 0, n_requests - 1 do
        local flags = ARGV[first_request + 5 * i]
        if string.find(flags, "f", 1, true) and not string.find(flags, "s", 1, true) then
            kept_only = false
            break
        end
    end
    if kept_only then
        redis.pcall("SREM", starts, "")
    end
end

-- Items: after the acks' writes (XADD is a "denyoom" command: see lease.lua), only
-- those of loose entries and of acks applied above.
local items_written, items_shed = 0, 0
if #items_due > 0 then
    local held = redis.call("XLEN", items)
    local counts = redis.pcall("HMGET", stats, "items", "items_bytes") -- (any type: numbers.lua)
    local written = type(counts) == "table" and tonumber(counts[1]) or 0
    local bytes = type(counts) == "table" and tonumber(counts[2]) or 0
    local size = written > 0 and bytes * held / written or 0 -- estimated bytes held
    local added_bytes = 0
    for _, i in ipairs(items_due) do
        local payload = ARGV[i + 2]
        if (items_cap > 0 and held >= items_cap)
                or (items_bytes > 0 and size + #payload > items_bytes) then
            items_shed = items_shed + 1
        else
            redis.call("XADD", items, "*", "class", ARGV[i], "url", ARGV[i + 1], "item", payload)
            held, size = held + 1, size + #payload
            items_written, added_bytes = items_written + 1, added_bytes + #payload
        end
    end
    if items_written > 0 then
        stats_add(stats, "items", items_written)
        stats_add(stats, "items_bytes", added_bytes)
    end
    if items_shed > 0 then
        stats_add(stats, "items_shed", items_shed)
    end
end
if items_fenced > 0 then
    stats_add(stats, "items_fenced", items_fenced)
end

local statuses = {}
local to_add = {}
local lanes, added = {}, {} -- the lanes of this batch, and requests added to each
local queued = {} -- lane -> requests queued before this batch (read when capped)
if backlog_cap == 0 then
    -- No cap: no status depends on an earlier request's, so the batch's fingerprints
    -- go to the dedup together (one BF.MADD with RedisBloom: lib/dedup.lua).
    local checks, checked = {}, {} -- fingerprints to check, and their requests
    for i = 1, n_requests do
        local base = first_request + 5 * (i - 1)
        local flags = ARGV[base]
        statuses[i] = "+"
        if string.find(flags, "s", 1, true) and redis.call("SADD", starts, ARGV[base + 1]) == 0 then
            statuses[i] = "s"
        elseif string.find(flags, "f", 1, true) then
            checks[#checks + 1], checked[#checked + 1] = ARGV[base + 1], i
        end
    end
    local news = dedup_add_all(checks)
    for j = 1, #checked do
        if news[j] == 0 then
            statuses[checked[j]] = "d"
        end
    end
    for i = 1, n_requests do
        local base = first_request + 5 * (i - 1)
        local lane = ARGV[base + 2]
        if not added[lane] then
            lanes[#lanes + 1] = lane
            added[lane] = 0
        end
        if statuses[i] == "+" then
            to_add[#to_add + 1] = base
            added[lane] = added[lane] + 1
        end
    end
end
-- With a cap, one request at a time: a dropped request must not reach the dedup (it
-- would be taken for seen when found again), and whether it is dropped depends on
-- how many of the batch's earlier requests of its lane were new.
for i = 0, backlog_cap > 0 and n_requests - 1 or -1 do
    local base = first_request + 5 * i
    local flags, fingerprint, lane = ARGV[base], ARGV[base + 1], ARGV[base + 2]
    local status = "+"
    if not added[lane] then
        lanes[#lanes + 1] = lane
        added[lane] = 0
        if backlog_cap > 0 then
            queued[lane] = lane_queued(lane)
        end
    end
    if backlog_cap > 0 and added[lane] + queued[lane] >= backlog_cap then
        status = "c" -- the cap holds within one batch too
    elseif string.find(flags, "s", 1, true) and redis.call("SADD", starts, fingerprint) == 0 then
        status = "s"
    elseif string.find(flags, "f", 1, true) and dedup_add(fingerprint) == 0 then
        status = "d"
    end
    statuses[#statuses + 1] = status
    if status == "+" then
        to_add[#to_add + 1] = base
        added[lane] = added[lane] + 1
    end
end

-- The batch's new requests into the queue, and their lanes' counts. A function of
-- its own: its locals would take this main chunk past Lua's 200 (the libraries'
-- count there too).
local function queue_added()
    -- Each (lane, priority)'s requests go onto its list in one push (lib/lists.lua)
    -- once the lane holds `lists_from` requests, or its list exists; before, and
    -- when a list's key holds another type, they go to the queue ZSET as members.
    local groups, group_of = {}, {}
    for _, base in ipairs(to_add) do
        local id = ARGV[base + 2] .. "\0" .. ARGV[base + 3]
        local group = group_of[id]
        if not group then
            group = { ARGV[base + 2], ARGV[base + 3], {} }
            group_of[id] = group
            groups[#groups + 1] = group
        end
        group[3][#group[3] + 1] = ARGV[base + 4]
    end
    local lifo = order == "lifo"
    local listed, new_lists, loose = 0, 0, {}
    for _, group in ipairs(groups) do
        local lane = group[1]
        local entry = lists_entry(lane, group[2], lifo)
        local new = redis.call("ZSCORE", queue, entry) == false
        local length = nil
        if not new or (queued[lane] or lane_queued(lane)) + added[lane] >= lists_from then
            length = lists_push(queue, entry, group[3], lifo, new)
            if not length then
                numbers_note(lists_key(queue, entry), "-", nil,
                             "left alone: its requests queued as members", "(the key holds no LIST)")
            end
        end
        if length then
            listed = listed + #group[3]
            new_lists = new_lists + (new and 1 or 0)
        else
            for _, payload in ipairs(group[3]) do
                loose[#loose + 1] = { lane, group[2], payload }
            end
        end
    end
    if listed > 0 then
        lists_adjust(queue, listed, new_lists)
    end
    if #loose > 0 then
        local first = seq_take(seq, #loose) - #loose + 1
        local pairs_ = {}
        for j, request in ipairs(loose) do
            pairs_[#pairs_ + 1] = 0
            pairs_[#pairs_ + 1] = member_make(request[1], request[2],
                                              member_order_key(first + j - 1, lifo), request[3])
        end
        call_in_chunks("ZADD", queue, pairs_)
    end
    if new_lists > 0 or #loose > 0 then
        hashed_keep(queue, "zset")
    end
    local grown = {}
    for _, lane in ipairs(lanes) do
        if added[lane] > 0 then
            grown[#grown + 1] = lane
        end
    end
    lanes_update(grown, nil, added, nil, true) -- a lane already due keeps its turn
    stats_add(stats, "enqueued", #to_add)
end

if #to_add > 0 then
    queue_added()
end
local filtered = n_requests - #to_add
if filtered > 0 then
    stats_add(stats, "filtered", filtered)
end
if acked > 0 then
    stats_add(stats, "acked", acked)
end
return { table.concat(statuses), acked, items_written, items_shed, numbers_repairs(),
         throttled }
