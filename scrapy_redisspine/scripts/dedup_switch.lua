--[[
dedup_switch: start moving the crawl's dedup record from the SET to a Bloom filter
once the SET holds `threshold` fingerprints. Atomic, and a no-op unless the mode is
"set", so any worker may call it at any time; the first call past the threshold
wins and its parameters become the crawl's.

Creates the filter (BF.RESERVE, or the bitmap's first layer, zeroed) and sets the
mode to "migrating" (or straight to "bloom" when the SET is empty). From then on
lib/dedup.lua checks the SET, then the filter, and adds to the filter only;
migrate_dedup.lua drains the SET.

KEYS[1]  seen   SET    raw fingerprints
KEYS[2]  dedup  HASH   dedup mode and Bloom filter parameters
KEYS[3]  bloom  STRING Bloom filter (must not exist yet)

ARGV[1]  threshold   fingerprints in the SET at which to switch (0: at once)
ARGV[2]  impl        "bitmap" or "redisbloom"
ARGV[3]  error_rate  target false-positive rate of the whole filter
ARGV[4]  capacity    fingerprints the filter holds before it first grows
ARGV[5 ..]  bitmap:     ARGV[5] bytes per block, ARGV[6 ..] layer specs
                        "offset blocks hashes capacity step 2" (bloom.py's plan_layers:
                        placement 2, the only one a new filter gets)
            redisbloom: ARGV[5] error rate of the first sub-filter, ARGV[6] expansion

Returns { mode, switched }: the mode after the call, and 1 if this call switched.
]]
local seen, dedup, bloom = KEYS[1], KEYS[2], KEYS[3]
local threshold, impl = tonumber(ARGV[1]), ARGV[2]
local error_rate, capacity = ARGV[3], ARGV[4]

local mode = redis.call("HGET", dedup, "mode") or "set"
if mode ~= "set" then
    return { mode, 0 }
end
local size = redis.call("SCARD", seen)
if size < threshold then
    return { mode, 0 }
end
if redis.call("EXISTS", bloom) == 1 then
    return redis.error_reply("dedup key " .. bloom .. " exists while the crawl's dedup "
        .. "mode is 'set': it was not written by scrapy_redisspine; delete it")
end
mode = size == 0 and "bloom" or "migrating"
local fields = { "mode", mode, "impl", impl, "error_rate", error_rate, "capacity", capacity }
if impl == "redisbloom" then
    redis.call("BF.RESERVE", bloom, ARGV[5], capacity, "EXPANSION", ARGV[6])
elseif impl == "bitmap" then
    local block_bytes, planned = tonumber(ARGV[5]), #ARGV - 5
    local offset, blocks = string.match(ARGV[6] or "", "^(%d+) (%d+) %d+ %d+ %d+ 2$")
    if not block_bytes or planned < 1 or not blocks then
        return redis.error_reply("dedup_switch: bad layer spec " .. tostring(ARGV[6]))
    end
    local more = { "block_bytes", block_bytes, "layers", 1, "max_layers", planned }
    for i = 1, #more do
        fields[#fields + 1] = more[i]
    end
    for i = 1, planned do
        fields[#fields + 1], fields[#fields + 2] = "layer:" .. i, ARGV[5 + i]
    end
    -- Allocate the first layer now, zeroed.
    local last = tonumber(offset) + tonumber(blocks) * block_bytes - 1
    redis.call("SETRANGE", bloom, string.format("%d", last), "\0")
else
    return redis.error_reply("dedup_switch: unknown filter implementation " .. tostring(impl))
end
redis.call("HSET", dedup, unpack(fields))
return { mode, 1 }
