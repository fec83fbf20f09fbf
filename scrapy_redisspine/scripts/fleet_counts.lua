--[[
fleet_counts: what a worker needs to decide that the crawl is finished, in one
atomic reading: nothing queued, nothing in flight, no worker still producing start
requests, and the crawl is the one the worker joined and has had work at all (a
crawl that never had a request queued is waiting for its first one, not done).

KEYS[1]  record    HASH   the crawl record (see register.lua)
KEYS[2]  queue     ZSET   queued requests
KEYS[3]  inflight  HASH   leased requests
KEYS[4]  starting  ZSET   worker id -> last heartbeat (ms) while producing start requests
KEYS[5]  stats     HASH   fleet-wide counters (enqueued: ever queued; leased: ever
                          leased, which a request kept in a worker's memory is without
                          being queued; or the record's finished_ms, once it finished)
KEYS[6]  control   HASH   fleet orders; the idle close sets close_reason = "idle"

ARGV[1]  epoch     the crawl's epoch, as the worker learned it at registration
ARGV[2]  alive_ms  a starting worker whose heartbeat is older than this is dead
ARGV[3]  idle_close_ms  REDISSPINE_IDLE_CLOSE_SECONDS in ms (0: no idle close, and
                    this script writes nothing)
ARGV[4..7]         (a sharded crawl only) queued, in flight, ever, mark: the shards'
                   totals from a double collect (shard_counts.lua), read by the
                   caller because they live under other hash tags; the queue and
                   inflight keys (the crawl-wide view's, never written) are not read

Idle close (fed crawls, REDISSPINE_KEEP_ALIVE): the record keeps idle_since_ms, the
Redis time a count first saw nothing queued and nothing in flight, and idle_mark, the
stats' enqueued + leased counters then. A count that sees work deletes both; one that
finds the mark moved (work came and went between two counts) starts the idle time
again, so only work resets it, never a worker joining or counting. Once the crawl was
idle for idle_close_ms with no live worker producing start requests, the close order
"idle" is set in control (unless another order is there): every worker closes.

On a replica it answers READONLY (an outage to the worker: no count, no finish).

Returns { status, queued, inflight, starting, ever, shed, idle_ms, close_reason,
cut_short }: status as lib/crawl.lua's crawl_status (counts are 0 unless "ok");
starting counts live workers still producing start requests, cut_short the workers
that stopped heartbeating while still producing them (killed, or stopped mid-start:
their entries stay until the crawl is purged), whose start requests not yet queued
the fleet cannot know; ever is 1 once any request was queued or leased (a crawl
whose requests were all kept in memory had work too); shed counts the newly
discovered requests workers dropped for lack of Redis memory (add_shed.lua): a crawl
done with shed > 0 is not "finished" (a count that is no number reads as 1); idle_ms
is how long the crawl has been idle (-1: it has work, or no idle close was asked),
close_reason the fleet's close order ("" if none).
]]
-- #include clock
-- #include crawl
-- #include numbers
-- #include lists
local record, queue, inflight, starting, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local control = KEYS[6]
local epoch, alive_ms, idle_close_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- A write first, which changes nothing and which only a replica refuses (READONLY):
-- a count read on a demoted primary (a Sentinel failover, while a pooled connection
-- still points at it; a replica about to resync) must never tell a worker "done".
-- HDEL is no denyoom command: a full Redis still counts. Other errors (a record of
-- the wrong type) are crawl_status's to report.
local probe = redis.pcall("HDEL", record, "")
local readonly = type(probe) == "table" and probe.err and string.find(probe.err, "READONLY", 1, true)
if readonly then  -- (Redis 6.2 puts "@user_script: N: -" in front: the reply starts at it)
    return redis.error_reply(string.sub(probe.err, readonly))
end
local status = crawl_status(record, epoch)
if status ~= "ok" then
    return { status, 0, 0, 0, 0, 0, -1, "", 0 }
end
local shed = redis.call("HGET", stats, "shed")
shed = shed and math.floor(tonumber(shed) or 1) or 0
local now_ms = clock_ms()
local queued, in_flight, shard_ever, shard_mark
if ARGV[4] then
    queued, in_flight = tonumber(ARGV[4]), tonumber(ARGV[5])
    shard_ever, shard_mark = tonumber(ARGV[6]), tonumber(ARGV[7])
else
    queued, in_flight = lists_size(queue), redis.call("HLEN", inflight)
end
local producing = redis.call("ZCOUNT", starting, now_ms - alive_ms, "+inf")
local cut_short = redis.call("ZCOUNT", starting, "-inf", "(" .. (now_ms - alive_ms))
local close_reason = redis.call("HGET", control, "close_reason") or ""

-- How long the crawl had no work (-1: it has some); see the header.
local function idle_for()
    if queued + in_flight > 0 then
        redis.call("HDEL", record, "idle_since_ms", "idle_mark")
        return -1
    end
    local counted = redis.pcall("HMGET", stats, "enqueued", "leased") -- (any type)
    local mark = shard_mark or 0
    if not shard_mark and type(counted) == "table" then
        mark = (count_of(counted[1]) or 0) + (count_of(counted[2]) or 0)
    end
    local kept = redis.call("HMGET", record, "idle_since_ms", "idle_mark")
    local since = time_of(kept[1])
    if not since or tostring(mark) ~= kept[2] then
        redis.call("HSET", record, "idle_since_ms", now_ms, "idle_mark", mark)
        return 0
    end
    return math.max(now_ms - since, 0)
end

local idle_ms = -1
if idle_close_ms > 0 then
    idle_ms = idle_for()
    if idle_ms >= idle_close_ms and producing == 0 and close_reason == "" then
        close_reason = "idle"
        redis.call("HSET", control, "close_reason", close_reason)
    end
end
return {
    status,
    queued,
    in_flight,
    producing,
    -- a crawl purged as finished (persistence off) keeps no counters, only that
    math.max(shard_ever or 0, redis.call("HEXISTS", stats, "enqueued"),
             redis.call("HEXISTS", stats, "leased"), redis.call("HEXISTS", record, "finished_ms")),
    shed,
    idle_ms,
    close_reason,
    cut_short,
}
