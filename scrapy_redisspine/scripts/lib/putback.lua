--[[
putback library: return a leased request to its lane's queue as it was. No fetch
happened, so the lane does not rest. Requires lib/hosts.lua included first and the
locals queue, inflight, leases, owned (keys).
]]
local function put_back(owner, key, member)
    redis.call("ZADD", queue, 0, member)
    redis.call("HDEL", inflight, key)
    redis.call("ZREM", leases, key)
    redis.call("ZREM", owned, owner .. "\n" .. key)
    local lane = member_lane(member)
    if lane then
        redis.call("HINCRBY", backlog, lane, 1)
        host_released(lane, nil)
    end
end
