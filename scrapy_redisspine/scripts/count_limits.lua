--[[
count_limits: add one worker's new items and spider errors to the fleet's counts and
check the fleet-wide limits (Scrapy's CLOSESPIDER_ITEMCOUNT, _ERRORCOUNT, _TIMEOUT;
the page count is checked by lease.lua). The first call that finds one reached sets
the fleet's close order, so every worker closes with that reason; it is never
replaced by another.

KEYS[1]  stats    HASH   fleet-wide counters: `scraped` items, `spider_errors`
KEYS[2]  control  HASH   fleet orders; field close_reason
KEYS[3]  record   HASH   the crawl record: `created_ms`, the crawl's first start

ARGV[1]  epoch        the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  items        items this worker scraped since its last call
ARGV[3]  errors       spider errors this worker had since its last call
ARGV[4]  item_limit   CLOSESPIDER_ITEMCOUNT (0: none)
ARGV[5]  error_limit  CLOSESPIDER_ERRORCOUNT (0: none)
ARGV[6]  timeout_ms   CLOSESPIDER_TIMEOUT in ms, from the crawl's first start (0: none)

Returns the close order ("" if none), or the error "LOST <status>" when the crawl is
not the caller's (nothing written).
]]
-- #include clock
-- #include crawl
-- #include numbers
local stats, control, record = KEYS[1], KEYS[2], KEYS[3]
local epoch, items, errors = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local item_limit, error_limit, timeout_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused
end
local reason = redis.call("HGET", control, "close_reason")
if items > 0 then
    stats_add(stats, "scraped", items)
end
if errors > 0 then
    stats_add(stats, "spider_errors", errors)
end
if reason then
    return reason
end
local counts = redis.pcall("HMGET", stats, "scraped", "spider_errors") -- (any type)
local scraped = type(counts) == "table" and tonumber(counts[1]) or 0
local failed = type(counts) == "table" and tonumber(counts[2]) or 0
local created = tonumber(redis.call("HGET", record, "created_ms"))
if item_limit > 0 and scraped >= item_limit then
    reason = "closespider_itemcount"
elseif error_limit > 0 and failed >= error_limit then
    reason = "closespider_errorcount"
elseif timeout_ms > 0 and created and clock_ms() - created >= timeout_ms then
    reason = "closespider_timeout"
end
if reason then
    redis.call("HSET", control, "close_reason", reason)
    return reason
end
return ""
