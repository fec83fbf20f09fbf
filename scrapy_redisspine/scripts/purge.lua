--[[
purge: delete every key of a crawl and leave a tombstone in its record, in one
step, so that workers still running on the crawl learn at their next heartbeat
that it was purged (and say so), rather than taking the emptiness for lost state
or for a finished crawl. A worker that registers later starts the crawl afresh.

KEYS[1]  record   HASH   the crawl record (see register.lua): left holding only
                         purged_ms
KEYS[2]  busy     HASH   lane -> the crawl's requests in flight
KEYS[3]  group_busy HASH lane -> the politeness group's requests in flight: the
                         crawl's counts leave it (lib/group.lua), the key stays
KEYS[4 ..]        every other key of the crawl; of a sharded crawl on one server,
                  each shard's busy HASH first (ARGV[1] of them), whose counts leave
                  group_busy as KEYS[2]'s do

ARGV[1]  shard_busy  how many of KEYS[4 ..] are shards' busy HASHes (absent: 0)

Purged requests still in flight free their lanes' group slots here: their workers'
acks will be refused (the crawl is gone), so no one else would.

Returns the number of keys deleted.
]]
-- #include clock
-- #include group
-- #include lists
local record, busy, group_busy = KEYS[1], KEYS[2], KEYS[3]
local shard_busy = tonumber(ARGV[1] or "0")
for i = 4, 3 + shard_busy do
    group_forget(KEYS[i], group_busy) -- before the UNLINK below deletes them
end
-- UNLINK first: it is no "denyoom" command, so a purge works on a full Redis.
local deleted = 0
if #KEYS >= 4 then
    -- a queue's lists (lib/lists.lua) before the queue: UNLINK, no "denyoom" either
    deleted = lists_delete_queues(KEYS, 4)
    deleted = deleted + redis.call("UNLINK", unpack(KEYS, 4))
end
group_forget(busy, group_busy)
deleted = deleted + redis.call("UNLINK", record, busy)
redis.call("HSET", record, "purged_ms", clock_ms())
return deleted
