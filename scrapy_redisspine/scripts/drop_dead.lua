--[[
drop_dead: remove dead letters for good (`redisspine dead-letters --drop ID | --all`),
with what else is kept of them (their requeue count), in one step, and count them.

KEYS[1]  dead      HASH   dead letters: field (order key) -> reason \n member
KEYS[2]  requeues  HASH   order key -> times requeued
KEYS[3]  stats     HASH   fleet-wide counters (dead_dropped)
KEYS[4]  record    HASH   the crawl record: writes only while it is the caller's crawl

ARGV[1]     epoch  the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2 ..]  dead-letter fields to drop (the caller sends them in batches)

Returns { dropped, repairs }: how many of the fields were dead letters (and are
gone), and the values of crawl keys repaired (lib/numbers.lua).
]]
-- #include crawl
-- #include numbers
-- #include keytypes
local dead, requeues, stats, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local epoch = ARGV[1]
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
keys_expect(dead, "hash", requeues, "hash")

local dropped = 0
for i = 2, #ARGV do
    if redis.call("HDEL", dead, ARGV[i]) == 1 then
        redis.call("HDEL", requeues, ARGV[i])
        dropped = dropped + 1
    end
end
if dropped > 0 then
    stats_add(stats, "dead_dropped", dropped)
end
return { dropped, numbers_repairs() }
