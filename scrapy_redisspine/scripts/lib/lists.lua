--[[
lists library: where enqueue puts a request (issue 19). From a lane's 4th queued
request on (`lists_from`), its new requests of one priority wait in a LIST of their
own, holding just their payloads in arrival order, and the queue ZSET holds one
index entry for that list. A ZSET member costs about 95 bytes of structure (skiplist
node, dict entry, bucket) before its own bytes; a list item costs 2-3 bytes over its
payload, and the lane and priority are said once per list. A list is a key, though
(~230 bytes with its entry): a lane with fewer requests keeps them as members, which
is cheaper there (a broad crawl's many lanes of one or two URLs).

The queue ZSET holds two kinds of members (all with score 0, one lex range a lane):
  a request:      lane \0 priority key order key payload  (lib/member.lua): queued
                  while its lane held fewer than `lists_from`, put back by a release
                  or a requeue, re-injected, or queued by an earlier version
  an index entry: lane \0 priority key mark, for the list of that lane, priority and
                  order. FIFO's mark "~" sorts after the order keys' digits: the
                  members of its priority, older than anything in the list (a list
                  once made takes every new request of its lane and priority) or put
                  back, go first. LIFO's "!" sorts before them: the list's requests,
                  the newest, go first; requests put back go after them.
An order key is given when a request leaves its list (lease.lua), from `seq`: a lease
is recorded exactly as before, and everything after it (acks, sweeps, dead letters)
is unchanged.

Key names. These two are derived from the queue key here and in keys.py alone (the
rule that scripts never build key names bends for them: a lane's lists cannot be
known before the script picks the lane; they carry the queue's hash tag, so they live
in its slot):
  the list of an index entry:  queue .. ":" .. entry
  the counts HASH:             queue .. "#n", fields `requests` (held in lists) and
                               `lists` (index entries)
So the crawl's queued requests are ZCARD(queue) - lists + requests.

A list missing its data is never taken for an empty lane in silence: an index entry
whose list is gone (deleted by hand) or whose key holds another type leaves the
queue with a repair recorded (the key is left alone); counts that are no numbers are
counted again.
Includes member, numbers. Needs nothing: the keys are arguments.

lists_entry(lane, priority_key, lifo), lists_key(queue, entry) -> names
lists_entry_parts(entry) -> lane, priority key of an index entry; nil for a request
lists_size(queue) -> requests queued (never 0 while the queue ZSET holds anything)
lists_lane_count(queue, lane) -> requests queued in the lane, counted (repairs only)
lists_adjust(queue, d_requests, d_lists): the counts follow a change
lists_push(queue, entry, payloads, lifo, new) -> the list's length; nil if its key
    holds another type (the caller queues the requests as members). `new`: the entry
    is not in the queue yet (the caller asked ZSCORE), so push writes it
lists_read(queue, entry, n) -> up to n payloads from the list's head; nil, reason
    when the list's key holds another type
lists_drop_lane(queue, lane) -> requests dropped: every list of the lane deleted and
    every member of the lane removed (the per-lane page limit)
lists_delete(queue) -> how many lists of the queue were deleted (a purge or a flush,
    before the queue goes)
lists_delete_queues(keys, first) -> lists_delete of each of keys[first ..] named as
    a queue (":queue" or "/queue" at its end, keys.py): the scripts that delete a crawl's keys
]]
-- #include member
-- #include numbers
local lists_fifo, lists_lifo = 126, 33 -- "~", "!": an entry's last byte
local lists_from = 4 -- a lane's requests go to lists from its 4th queued request

local function lists_key(queue, entry)
    return queue .. ":" .. entry
end

local function lists_counts(queue)
    return queue .. "#n"
end

local function lists_entry(lane, priority_key, lifo)
    return lane .. "\0" .. priority_key .. (lifo and "!" or "~")
end

local function lists_entry_parts(entry)
    local n = #entry
    local mark = member_byte(entry, n)
    if n < 7 or (mark ~= lists_fifo and mark ~= lists_lifo) then
        return nil
    end
    -- a request's member has 20 or more bytes after its first NUL
    if member_find(entry, "\0", 1, true) ~= n - 6 then
        return nil
    end
    return member_sub(entry, 1, n - 7), member_sub(entry, n - 5, n - 1)
end

local function lists_extra(queue)
    local raw = redis.pcall("HMGET", lists_counts(queue), "requests", "lists")
    if type(raw) ~= "table" or raw.err then
        return 0 -- (a key of the wrong type: the next write counts again)
    end
    local requests, lists = count_of(raw[1]), count_of(raw[2])
    if not (requests and lists) then
        return 0
    end
    return math.max(requests - lists, 0)
end

local function lists_size(queue)
    return redis.call("ZCARD", queue) + lists_extra(queue)
end

-- Calls visit(entry) for every member of the queue, 1000 at a time (a queue of
-- earlier versions may hold millions of requests).
local function lists_each(queue, visit)
    local low = "-"
    while true do
        local page = redis.call("ZRANGEBYLEX", queue, low, "+", "LIMIT", 0, 1000)
        for _, entry in ipairs(page) do
            visit(entry)
        end
        if #page < 1000 then
            return
        end
        low = "(" .. page[#page]
    end
end

local function lists_len(key)
    local n = redis.pcall("LLEN", key)
    return type(n) == "number" and n or 0
end

-- The lane's members (requests) and lists: how many members, and each list's key
-- with its length. For the repairs and the page limit only: it reads the whole lane.
local function lists_lane(queue, lane)
    local low, high = lane_range(lane)
    local members, lists = 0, {}
    for _, entry in ipairs(redis.call("ZRANGEBYLEX", queue, low, high)) do
        if lists_entry_parts(entry) then
            local key = lists_key(queue, entry)
            lists[#lists + 1] = { key, lists_len(key) }
        else
            members = members + 1
        end
    end
    return members, lists
end

local function lists_lane_count(queue, lane)
    local count, lists = lists_lane(queue, lane)
    for _, list in ipairs(lists) do
        count = count + list[2]
    end
    return count
end

local function lists_recount(queue, message)
    local key = lists_counts(queue)
    local requests, lists = 0, 0
    lists_each(queue, function(entry)
        if lists_entry_parts(entry) then
            requests = requests + lists_len(lists_key(queue, entry))
            lists = lists + 1
        end
    end)
    redis.call("DEL", key)
    redis.call("HSET", key, "requests", requests, "lists", lists)
    numbers_note(key, "requests", nil, requests .. " (counted again)", message)
end

local function lists_adjust(queue, d_requests, d_lists)
    local key = lists_counts(queue)
    -- (-0, e.g. -#emptied of none, goes to Redis as "-0", which is no integer to it)
    d_requests, d_lists = d_requests == 0 and 0 or d_requests, d_lists == 0 and 0 or d_lists
    -- Both fields every time (an increment by 0 reads the field as a number): a
    -- field that holds garbage is counted again at the next change of either.
    local ok, message = hincrby_checked(key, "requests", d_requests)
    if ok then
        ok, message = hincrby_checked(key, "lists", d_lists)
    end
    if not ok then
        lists_recount(queue, message)
    end
end

local function lists_push(queue, entry, payloads, lifo, new)
    local key = lists_key(queue, entry)
    local command = lifo and "LPUSH" or "RPUSH"
    local length = 0
    -- A list without its index entry was left by a crawl flushed or purged before
    -- (or its entry was deleted by hand): nothing reaches it, so nothing in it is the
    -- crawl's now. (Its entry is written after the push: a push refused for the
    -- key's type leaves no entry behind.)
    if new then
        local stale = lists_len(key)
        if stale > 0 then
            redis.call("UNLINK", key)
            numbers_note(key, "-", nil, "deleted", "(a list of " .. stale .. " no entry reached)")
        end
    end
    for i = 1, #payloads, 1000 do
        local reply = redis.pcall(command, key, unpack(payloads, i, math.min(i + 999, #payloads)))
        if type(reply) ~= "number" then
            if i == 1 and string.find(tostring(reply.err), "WRONGTYPE", 1, true) then
                return nil
            end
            error(reply) -- not the key's type (after a first chunk went in: cannot be)
        end
        length = reply
    end
    if new then
        redis.call("ZADD", queue, 0, entry)
    end
    return length
end

local function lists_read(queue, entry, n)
    local reply = redis.pcall("LRANGE", lists_key(queue, entry), 0, n - 1)
    if type(reply) == "table" and reply.err then
        if string.find(tostring(reply.err), "WRONGTYPE", 1, true) then
            return nil, "queue list of the wrong type"
        end
        error(reply) -- e.g. a cluster slot on its way to another node: try again later
    end
    return reply
end

local function lists_drop_lane(queue, lane)
    local dropped, lists = lists_lane(queue, lane)
    local listed = 0
    for _, list in ipairs(lists) do
        listed = listed + list[2]
        redis.call("UNLINK", list[1])
    end
    local low, high = lane_range(lane)
    redis.call("ZREMRANGEBYLEX", queue, low, high)
    if #lists > 0 then
        lists_adjust(queue, -listed, -#lists)
    end
    return dropped + listed
end

local function lists_delete(queue)
    local deleted = 0
    if redis.call("TYPE", queue).ok ~= "zset" then
        return 0
    end
    lists_each(queue, function(entry)
        if lists_entry_parts(entry) then
            deleted = deleted + redis.call("UNLINK", lists_key(queue, entry))
        end
    end)
    return deleted
end

local function lists_delete_queues(keys, first)
    local deleted = 0
    for i = first, #keys do
        if string.find(keys[i], "[:/]queue$") then
            deleted = deleted + lists_delete(keys[i])
        end
    end
    return deleted
end
