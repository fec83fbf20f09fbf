--[[
add_shed: count, fleet-wide, the newly discovered requests a worker dropped because
Redis had no memory for them, so that no worker closes as "finished" over them
(fleet_counts.lua returns the count). A worker sends it before the ack of the request
whose callback found them, so it is in Redis before the crawl can look done.

KEYS[1]  stats     HASH   fleet-wide counters (field "shed")
KEYS[2]  record    HASH   the crawl record: writes only while it is the caller's crawl

ARGV[1]  epoch     the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  shed      requests dropped since the worker's last report

Returns 1 when counted, 0 when the crawl is not the caller's (nothing written).
]]
-- #include crawl
-- #include numbers
local stats, record = KEYS[1], KEYS[2]
if crawl_status(record, ARGV[1]) ~= "ok" then
    return 0
end
-- HDEL first (of a field that never exists): no "denyoom" command, so the count goes
-- in on the full Redis it is about; Redis checks maxmemory only before a first write.
redis.call("HDEL", stats, "")
stats_add(stats, "shed", tonumber(ARGV[2]))
return 1
