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

ARGV[1]  epoch     the crawl's epoch, as the worker learned it at registration
ARGV[2]  alive_ms  a starting worker whose heartbeat is older than this is dead

Returns { status, queued, inflight, starting, ever, shed }: status as lib/crawl.lua's
crawl_status (counts are 0 unless "ok"); starting counts live workers still
producing start requests; ever is 1 once any request was queued or leased (a crawl
whose requests were all kept in memory had work too); shed counts the newly
discovered requests workers dropped for lack of Redis memory (add_shed.lua): a crawl
done with shed > 0 is not "finished" (a count that is no number reads as 1).
]]
-- #include clock
-- #include crawl
local record, queue, inflight, starting, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local epoch, alive_ms = ARGV[1], tonumber(ARGV[2])
local status = crawl_status(record, epoch)
if status ~= "ok" then
    return { status, 0, 0, 0, 0, 0 }
end
local shed = redis.call("HGET", stats, "shed")
shed = shed and math.floor(tonumber(shed) or 1) or 0
return {
    status,
    redis.call("ZCARD", queue),
    redis.call("HLEN", inflight),
    redis.call("ZCOUNT", starting, clock_ms() - alive_ms, "+inf"),
    -- a crawl purged as finished (persistence off) keeps no counters, only that
    math.max(redis.call("HEXISTS", stats, "enqueued"), redis.call("HEXISTS", stats, "leased"),
             redis.call("HEXISTS", record, "finished_ms")),
    shed,
}
