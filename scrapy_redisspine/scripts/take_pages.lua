--[[
take_pages: the page budget of a sharded crawl (Scrapy's CLOSESPIDER_PAGECOUNT,
fleet-wide, with REDISSPINE_SHARDS > 1), kept on the crawl-wide keys. The shards'
lease scripts cannot read one counter (on Redis Cluster they are in other slots), so
a worker takes pages from the budget before it leases (`want`), leases at most that
many from the shards, then settles (`used`: how many it leased); what it did not
lease goes back to the budget. Pages leased never exceed the budget: a hold counts
as spent until it is settled, and the hold of a worker that died before settling
counts as spent for good (it may have leased them all). So a crawl whose workers
die may close having fetched fewer pages than the budget, never more.

KEYS[1]  stats       HASH   crawl-wide counters: `pages_taken`, pages leased or held
KEYS[2]  page_holds  HASH   worker id -> pages it took and has not settled yet
KEYS[3]  control     HASH   fleet orders; field close_reason
KEYS[4]  record      HASH   the crawl record: writes only while it is the caller's crawl
KEYS[5]  workers     ZSET   worker id -> last heartbeat (ms, Redis TIME)

ARGV[1]  epoch     the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]  worker    the caller's worker id
ARGV[3]  budget    CLOSESPIDER_PAGECOUNT (> 0)
ARGV[4]  used      pages the caller leased of its hold ("": nothing to settle)
ARGV[5]  want      pages it asks for now (0: only settle)
ARGV[6]  alive_ms  a holder silent longer than this is dead: its hold stays spent

The budget spent and no hold left to settle: the close order `closespider_pagecount`
is set, as lease.lua sets it on an unsharded crawl. A `pages_taken` that holds no
count reads as the whole budget (never over-spend) and is repaired to it.

Returns { granted, close_reason, repairs }, or the error "LOST <status>" when the
crawl is not the caller's (nothing written).
]]
-- #include clock
-- #include crawl
-- #include numbers
local stats, page_holds, control, record, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local epoch, worker, budget = ARGV[1], ARGV[2], tonumber(ARGV[3])
local used, want, alive_ms = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local refused = crawl_refusal(record, epoch)
if refused then
    return refused
end
local raw = redis.call("HGET", stats, "pages_taken")
local taken = count_of(raw)
if taken == nil then
    taken = budget
    numbers_note(stats, "pages_taken", raw, tostring(budget))
end
if used ~= "" then
    local held = count_of(redis.call("HGET", page_holds, worker)) or 0
    local leased = math.min(tonumber(used) or held, held)
    taken = math.max(taken - (held - leased), 0)
    redis.call("HDEL", page_holds, worker)
end
local granted = 0
local close_reason = redis.call("HGET", control, "close_reason") or ""
if close_reason == "" and want > 0 then
    local cutoff = clock_ms() - alive_ms
    local held = redis.call("HGETALL", page_holds)
    for i = 1, #held, 2 do
        local beat = tonumber(redis.call("ZSCORE", workers, held[i]) or "")
        if held[i] ~= worker and (not beat or beat < cutoff) then
            redis.call("HDEL", page_holds, held[i]) -- dead: what it held stays spent
        end
    end
    local left = budget - taken
    if left > 0 then
        granted = math.min(want, left)
        taken = taken + granted
        redis.call("HSET", page_holds, worker, granted)
    elseif redis.call("HLEN", page_holds) == 0 then
        close_reason = "closespider_pagecount"
        redis.call("HSET", control, "close_reason", close_reason)
    end
end
redis.call("HSET", stats, "pages_taken", taken)
return { granted, close_reason, numbers_repairs() }
