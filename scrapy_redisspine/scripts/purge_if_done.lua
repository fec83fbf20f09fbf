--[[
purge_if_done: delete every key of a crawl, but only when the crawl is done
(nothing queued, nothing in flight), so that a worker closing with persistence
off can never delete work that another worker still needs.

KEYS[1]  queue     ZSET
KEYS[2]  inflight  HASH
KEYS[3 ..]         every other key of the crawl

Returns 1 when the crawl was deleted, 0 when work remains.
]]
local queue, inflight = KEYS[1], KEYS[2]

if redis.call("ZCARD", queue) > 0 or redis.call("HLEN", inflight) > 0 then
    return 0
end
redis.call("DEL", unpack(KEYS))
return 1
