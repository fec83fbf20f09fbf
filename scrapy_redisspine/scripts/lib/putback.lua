--[[
putback library: return a leased request to its lane's queue as it was. No fetch
happened, so the lane does not rest. Requires lib/member.lua, lib/lanes.lua and
lib/entry.lua included first and the locals queue, inflight, leases, owned (keys).
]]
-- #include member
-- #include lanes
-- #include entry
local function put_back(owner, key, member)
    redis.call("ZADD", queue, 0, member)
    lease_end(owner, key)
    local lane = member_lane(member)
    if lane then
        host_released(lane, nil, true)
    end
end
