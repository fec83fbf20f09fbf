--[[
seen: record fingerprints in the crawl's dedup record (SET or Bloom filter, see
lib/dedup.lua) and say which were new, in one atomic step for the whole batch.
Used by RedisDupeFilter.request_seen (other schedulers), tools and benchmarks; the
scheduler's own path is enqueue.lua, which includes the same library.

KEYS[1]  seen   SET    raw fingerprints
KEYS[2]  dedup  HASH   dedup mode and Bloom filter parameters
KEYS[3]  bloom  STRING Bloom filter (bitmap or RedisBloom)

ARGV[1 ..]      fingerprints (raw bytes)

Returns { statuses, repairs }: a string with one character per fingerprint, "1" new
(now recorded), "0" seen before; and the values of crawl keys repaired
(lib/numbers.lua, e.g. a Bloom layer's count).
]]
-- #include dedup
-- #include numbers
local seen, dedup, bloom = KEYS[1], KEYS[2], KEYS[3]
dedup_init(seen, dedup, bloom)
local statuses = dedup_add_all(ARGV)
for i = 1, #statuses do
    statuses[i] = statuses[i] == 1 and "1" or "0"
end
return { table.concat(statuses), numbers_repairs() }
