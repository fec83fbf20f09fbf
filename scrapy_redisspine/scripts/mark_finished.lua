--[[
mark_finished: note in the crawl record that the crawl finished, if it did: nothing
queued and nothing in flight, and the record is still the one the worker joined.
A worker starting this crawl again is then told that it finished, and when.

KEYS[1]  record    HASH   the crawl record (see register.lua)
KEYS[2]  queue     ZSET   queued requests
KEYS[3]  inflight  HASH   leased requests

ARGV[1]  epoch     the crawl's epoch, as the worker learned it at registration

Returns 1 when the record now says finished, 0 when work remains or the record is
not the worker's crawl any more.
]]
-- #include clock
local record, queue, inflight = KEYS[1], KEYS[2], KEYS[3]
local epoch = ARGV[1]
if redis.call("HGET", record, "epoch") ~= epoch then
    return 0
end
if redis.call("ZCARD", queue) > 0 or redis.call("HLEN", inflight) > 0 then
    return 0
end
-- HDEL first: no "denyoom" command, so the record is marked on a full Redis too
redis.call("HDEL", record, "finished_ms")
redis.call("HSET", record, "finished_ms", clock_ms())
return 1
