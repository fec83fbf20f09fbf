--[[
migrate_dedup: move up to `count` fingerprints from the SET into the Bloom filter
in one atomic step (SPOP, then add), and finish the switch when the SET is empty.

Each call pops members no other call can pop, so any number of workers may run
chunks at the same time, and a chunk is never half done: every fingerprint is in
the SET or in the filter at every moment, and lib/dedup.lua checks both while the
mode is "migrating". The SET shrinks as it drains and Redis deletes it when it is
empty, so freeing it never blocks. `count` bounds how long one call holds Redis.

KEYS[1]  seen   SET    raw fingerprints being drained
KEYS[2]  dedup  HASH   dedup mode and Bloom filter parameters
KEYS[3]  bloom  STRING Bloom filter (bitmap or RedisBloom)

ARGV[1]  count  most fingerprints moved by this call (>= 1)

Returns { mode, moved, remaining, repairs }: the mode after the call ("bloom" once
the SET is empty; calls in any other mode than "migrating" change nothing), the
number of fingerprints moved, the number left in the SET, and the values of crawl
keys repaired (lib/numbers.lua, e.g. a Bloom layer's count).
]]
-- #include dedup
-- #include numbers
local seen, dedup, bloom = KEYS[1], KEYS[2], KEYS[3]
local count = tonumber(ARGV[1])
local mode_now, impl = dedup_init(seen, dedup, bloom)

if mode_now ~= "migrating" then
    return { mode_now, 0, redis.call("SCARD", seen), numbers_repairs() }
end
local members = redis.call("SPOP", seen, count)
if #members > 0 then
    if impl == "redisbloom" then
        redis.call("BF.MADD", bloom, unpack(members))
    else
        for _, member in ipairs(members) do
            dedup_filter_add(member)
        end
    end
end
local remaining = redis.call("SCARD", seen)
local mode = "migrating"
if remaining == 0 then
    mode = "bloom"
    redis.call("HSET", dedup, "mode", mode)
end
return { mode, #members, remaining, numbers_repairs() }
