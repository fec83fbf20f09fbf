--[[
add_fleet_stats: add one worker's stats growth to the fleet's sums, all or nothing.

Each worker adds what its numeric Scrapy stats grew by since its last push. Done as
one script so that a push is never half applied (a worker that retries a push that
failed half way would count the other half twice), and so that a field someone
overwrote with a non-number is skipped and reported instead of failing the push of
every other field, on every sweep, for every worker.

KEYS[1]  fleet_stats  HASH  stat name -> sum over the fleet
KEYS[2]  record       HASH  the crawl record: writes only while it is the caller's crawl

ARGV[1]     epoch  the caller's crawl epoch ("": a tool, no check; lib/crawl.lua)
ARGV[2 ..]  pairs: stat name, growth (an integer, or a decimal with a ".")

Returns the names of the fields skipped because they hold no number.
]]
-- #include crawl
local fleet_stats, record = KEYS[1], KEYS[2]
local refused = crawl_refusal(record, ARGV[1])
if refused then
    return refused -- the crawl is gone: write nothing
end

local names = {}
for i = 2, #ARGV, 2 do
    names[#names + 1] = ARGV[i]
end
local current = #names > 0 and redis.call("HMGET", fleet_stats, unpack(names)) or {}
-- Every field is checked before the first write: a push adds every good field, or
-- (should Redis refuse a write) fails having written nothing.
local skipped, writes = {}, {}
for j, name in ipairs(names) do
    local value, growth = current[j], ARGV[2 * j + 1]
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
return skipped
