--[[
feed_done: end a batch the worker read from the crawl's feed key (a LIST or ZSET the
user fills, scrapy-redis's `<spider>:start_urls`): remove the entries it enqueued
and move the ones it could not read to the dead letters with their reasons, in one
step. The worker calls it only after the enqueue of the good entries succeeded, so
a worker that dies in between leaves the batch in the feed, and the next read
enqueues it again through the dedup (feed entries cannot be dont_filter): nothing
is lost, nothing is fetched twice.

KEYS[1]  dead    HASH   dead letters: field -> reason \n entry (the field is
                        "feed:" and the entry's SHA-1, no order key, so
                        `requeue-dead` leaves it dead)
KEYS[2]  stats   HASH   fleet-wide counters (fed, feed_dead_lettered)
KEYS[3]  record  HASH   the crawl record: writes only while it is the caller's crawl
KEYS[4 ..]       the feed key (one): outside the crawl's hash tag unless the user
                 named it with it, so on Redis Cluster it must be given a {crawl}
                 tag (docs: Operations, "Feeding a live crawl")

ARGV[1]  epoch   the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  kind    "list" or "zset": how the feed key is read
ARGV[3]  bad     how many dead entries follow, each as field, reason, entry
ARGV[4 ..]       field, reason, entry (bad ones), then the enqueued entries

Returns { removed, buried, repairs }: entries taken out of the feed (one copy of
each: LREM 1 from the head, the end the batch was read from), entries dead-lettered,
and the values of crawl keys repaired (lib/numbers.lua).
]]
-- #include crawl
-- #include numbers
-- #include keytypes
local dead, stats, record = KEYS[1], KEYS[2], KEYS[3]
local feed = KEYS[#KEYS] -- KEYS[4 ..]: the one feed key
local epoch, kind, bad = ARGV[1], ARGV[2], tonumber(ARGV[3])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end
keys_expect(dead, "hash")
if kind ~= "list" and kind ~= "zset" then
    error("feed_done: kind must be list or zset, got " .. tostring(kind))
end

local function take(entry)
    if kind == "list" then
        return redis.call("LREM", feed, 1, entry)
    end
    return redis.call("ZREM", feed, entry)
end

local removed, buried = 0, 0
local first_good = 4 + 3 * bad
for i = 4, first_good - 1, 3 do
    local field, entry = ARGV[i], ARGV[i + 2]
    local reason = string.gsub(ARGV[i + 1], "\n", " ")
    if take(entry) > 0 then
        removed = removed + 1
        redis.call("HSET", dead, field, reason .. "\n" .. entry)
        buried = buried + 1
    end
end
for i = first_good, #ARGV do
    removed = removed + take(ARGV[i])
end
if removed > buried then
    stats_add(stats, "fed", removed - buried)
end
if buried > 0 then
    stats_add(stats, "feed_dead_lettered", buried)
end
return { removed, buried, numbers_repairs() }
