--[[
putback library: return a leased request to its lane's queue as it was. No fetch
happened, so the lane does not rest, and the lease does not count against the
lane's page limit (REDISSPINE_HOST_PAGE_LIMIT): it is handed back to `lane_pages`.
Includes member, lanes, entry, pagelimit. Needs lanes_init and entry_init called first (by the
script).

put_back(queue, lane_pages, owner, key, member)
  queue       ZSET  the crawl's queue
  lane_pages  HASH  lane -> requests leased (lease.lua); only a count there drops
  owner       the worker that holds the lease `key` of the queue member `member`
]]
-- #include member
-- #include lanes
-- #include entry
-- #include pagelimit
local function put_back(queue, lane_pages, owner, key, member)
    -- the lease ends first: HDEL and ZREM are no "denyoom" commands, so a put-back
    -- (which frees as much as it takes) still works on a full Redis
    lease_end(owner, key)
    redis.call("ZADD", queue, 0, member)
    local lane = member_lane(member)
    if lane then
        host_released(lane, nil, true)
        page_limit_give_back(lane_pages, lane)
    end
end
