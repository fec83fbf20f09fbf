--[[
add_fleet_stats: add one worker's stats growth to the fleet's sums, all or nothing.

Each worker adds what its numeric Scrapy stats grew by since its last push. Done as
one script so that a push is never half applied (a worker that retries a push that
failed half way would count the other half twice), and so that a field someone
overwrote with a non-number is skipped and reported instead of failing the push of
every other field, on every sweep, for every worker.

The same step keeps the worker's own running totals (a JSON text made by the
caller) at Redis time in worker_stats, so that they outlive a worker that dies.

KEYS[1]  fleet_stats   HASH  stat name -> sum over the fleet
KEYS[2]  record        HASH  the crawl record: writes only while it is the caller's crawl
KEYS[3]  worker_stats  HASH  worker id -> "pushed ms \n running|closed \n totals JSON"

ARGV[1]     epoch   the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2]     worker  worker id ("": keep no totals of the worker)
ARGV[3]     state   "running", or "closed" for the last push as the worker closes
ARGV[4]     totals  the worker's own totals (JSON text, stored as given)
ARGV[5 ..]  pairs: stat name, growth (an integer, or a decimal with a ".")

Returns the names of the fields skipped because they hold no number.
]]
-- #include clock
-- #include crawl
local fleet_stats, record, worker_stats = KEYS[1], KEYS[2], KEYS[3]
local epoch, worker, state, totals = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local first = 5
local refused = crawl_refusal(record, epoch)
if refused then
    return refused -- the crawl is gone: write nothing
end

local names = {}
for i = first, #ARGV, 2 do
    names[#names + 1] = ARGV[i]
end
local current = #names > 0 and redis.call("HMGET", fleet_stats, unpack(names)) or {}
-- Every field is checked before the first write: a push adds every good field, or
-- (should Redis refuse a write) fails having written nothing.
local skipped, writes = {}, {}
for j, name in ipairs(names) do
    local value, growth = current[j], ARGV[first + 2 * j - 1]
    local integer = not value or string.match(value, "^%-?%d+$")
    if value and not integer and not (tonumber(value) and string.match(value, "^[-+%d.eE]+$")) then
        skipped[#skipped + 1] = name
    elseif integer and string.match(growth, "^%-?%d+$") then
        writes[#writes + 1] = { "HINCRBY", name, growth }
    else
        writes[#writes + 1] = { "HINCRBYFLOAT", name, growth }
    end
end
for _, write in ipairs(writes) do
    redis.call(write[1], fleet_stats, write[2], write[3])
end
if worker ~= "" then
    redis.call("HSET", worker_stats, worker, clock_ms() .. "\n" .. state .. "\n" .. totals)
end
return skipped
