--[[
bury: move a leased request that can never be processed (its payload does not
decode, names a forbidden class or callback ...) to the dead-letter HASH with the
reason, instead of dropping it or handing it out again and again.

KEYS[1]  inflight  HASH   order key -> owner \n score \n member
KEYS[2]  leases    ZSET   order key -> lease time (ms)
KEYS[3]  dead      HASH   order key -> reason \n score \n member
KEYS[4]  stats     HASH   fleet-wide counters

ARGV[1]  owner     worker id; leases of other owners are left alone
ARGV[2]  key       order key of the lease
ARGV[3]  reason    one line of text

Returns 1 if the lease was buried, 0 if it was not this owner's.
]]
local inflight, leases, dead, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner_prefix, key = ARGV[1] .. "\n", ARGV[2]
local reason = string.gsub(ARGV[3], "\n", " ")

local entry = redis.call("HGET", inflight, key)
if not entry or string.sub(entry, 1, #owner_prefix) ~= owner_prefix then
    return 0
end
redis.call("HSET", dead, key, reason .. "\n" .. string.sub(entry, #owner_prefix + 1))
redis.call("HDEL", inflight, key)
redis.call("ZREM", leases, key)
redis.call("HINCRBY", stats, "dead_lettered", 1)
return 1
