--[[
putback library: return a leased request to its lane's queue as it was. No fetch
happened, so the lane does not rest.
Includes member, lanes, entry. Needs lanes_init and entry_init called first (by the
script).

put_back(queue, owner, key, member)
  queue   ZSET  the crawl's queue
  owner   the worker that holds the lease `key` of the queue member `member`
]]
-- #include member
-- #include lanes
-- #include entry
local function put_back(queue, owner, key, member)
    -- the lease ends first: HDEL and ZREM are no "denyoom" commands, so a put-back
    -- (which frees as much as it takes) still works on a full Redis
    lease_end(owner, key)
    redis.call("ZADD", queue, 0, member)
    local lane = member_lane(member)
    if lane then
        host_released(lane, nil, true)
    end
end
