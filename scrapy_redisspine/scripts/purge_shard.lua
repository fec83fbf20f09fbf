--[[
purge_shard: delete one shard of a finished sharded crawl on Redis Cluster, the
step of a worker closing with persistence off that comes after purge_if_done.lua
(keep_record) and before the crawl's record goes (sharded_upkeep.py). The shard's
keys lie in their own slot, so this cannot be one script with the crawl's.

Only a shard that is still the caller's crawl's is touched: its copy of the crawl
record must hold the caller's epoch. A worker that started the crawl afresh
meanwhile wrote its own epoch there before anything else, so a late purge (a
closing worker that froze) never deletes the new crawl's work; and once the copy is
gone, every writing script of the shard refuses (lib/crawl.lua: "lost").

KEYS[1]  record     HASH   the shard's copy of the crawl record (epoch)
KEYS[2]  queue      ZSET   the shard's queued requests
KEYS[3]  inflight   HASH   the shard's leased requests
KEYS[4]  busy       HASH   lane -> the shard's requests in flight
KEYS[5]  group_busy HASH   lane -> the politeness group's requests in flight (kept:
                           the shard's counts leave it, lib/group.lua)
KEYS[6 ..]          every other key of the shard (not its items: the crawl's output)

ARGV[1]  epoch   the crawl's epoch
ARGV[2]  check   "1": delete nothing, only say whether the shard could go

Returns 1 when the shard was deleted (or could be, with check), 0 when it holds
work (queued or in flight: nothing deleted), -1 when it is not the caller's crawl's
(no copy of the record, or another epoch: nothing deleted).
]]
-- #include group
local record, queue, inflight, busy, group_busy = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local epoch, check = ARGV[1], ARGV[2] == "1"
if redis.call("HGET", record, "epoch") ~= epoch then
    return -1
end
if redis.call("ZCARD", queue) > 0 or redis.call("HLEN", inflight) > 0 then
    return 0
end
if check then
    return 1
end
group_forget(busy, group_busy) -- before the UNLINK below deletes it
-- UNLINK: no "denyoom" command, so a full Redis still lets a finished crawl go
redis.call("UNLINK", record, queue, inflight, busy)
if #KEYS >= 6 then
    redis.call("UNLINK", unpack(KEYS, 6))
end
return 1
