--[[
purge: delete every key of a crawl and leave a tombstone in its record, in one
step, so that workers still running on the crawl learn at their next heartbeat
that it was purged (and say so), rather than taking the emptiness for lost state
or for a finished crawl. A worker that registers later starts the crawl afresh.

KEYS[1]  record   HASH   the crawl record (see register.lua): left holding only
                         purged_ms
KEYS[2 ..]        every other key of the crawl

Returns the number of keys deleted.
]]
-- #include clock
local record = KEYS[1]
local deleted = redis.call("UNLINK", unpack(KEYS))
redis.call("HSET", record, "purged_ms", clock_ms())
return deleted
