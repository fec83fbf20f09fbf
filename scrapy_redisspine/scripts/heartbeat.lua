--[[
heartbeat: record that a worker is alive, stamped with the server's clock so that
workers on machines with skewed clocks agree on who is stale, and check that the
crawl the worker joined is still the one in Redis.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)
KEYS[2]  record    HASH   the crawl record (epoch ...; see register.lua)
KEYS[3]  starting  ZSET   worker id -> last heartbeat (ms) while its start requests
                          are still being produced
KEYS[4]  queue     ZSET   queued requests (counted: the worker's len(scheduler))

ARGV[1]  worker    worker id
ARGV[2]  epoch     the crawl's epoch, as the worker learned it at registration
ARGV[3]  starting  "1" while this worker's spider still produces start requests

Returns { status, late_ms, queued, server }:
  queued is the number of requests queued fleet-wide (0 unless "ok" or "swept").
  server is the server's run id (INFO server; "" where a server gives none): a new one
  means Redis restarted or another server took over, which may have lost writes it
  had confirmed (the worker reconciles, see _guard.server_changed).
  "ok"       the worker's entry was there; late_ms is how long ago its previous
             heartbeat was (a worker paused or cut off past the timeout whose
             leases nobody swept yet is late, not dead)
  "swept"    its entry was gone: a sweep took it for dead and requeued its leases,
             so acks of what it holds will be refused; it is stamped alive again
  "lost"     the crawl record is gone (Redis restarted without persistence, was
             flushed, or failed over to an empty replica): nothing is written
  "purged"   the record is a tombstone left by `redisspine purge`: nothing written
  "changed"  the record holds another epoch (the crawl was purged or lost and
             started afresh): nothing is written
]]
-- #include clock
-- #include crawl
-- #include lists
local workers, record, starting, queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, epoch, still_starting = ARGV[1], ARGV[2], ARGV[3]
local status = crawl_status(record, epoch)
if status ~= "ok" then
    return { status, 0, 0, "" }
end
local info = redis.pcall("INFO", "server")
local server = type(info) == "string" and string.match(info, "run_id:(%w+)") or ""
local now_ms = clock_ms()
-- ZREM first (not denyoom): Redis checks maxmemory only before a script's first
-- write, and a heartbeat of a few bytes must not fail on a full Redis, or live
-- workers would be taken for dead.
local previous = redis.call("ZSCORE", workers, worker)
redis.call("ZREM", workers, worker)
redis.call("ZADD", workers, now_ms, worker)
if still_starting == "1" then
    redis.call("ZADD", starting, now_ms, worker)
else
    redis.call("ZREM", starting, worker)
end
-- A sweep that took only part of a dead worker's leases (it hit its limit) leaves
-- the worker's score at 0, so that it is swept again and learns it here.
if not previous or tonumber(previous) == 0 then
    return { "swept", 0, lists_size(queue), server }
end
return { "ok", math.max(now_ms - (tonumber(previous) or now_ms), 0), lists_size(queue),
         server }
