--[[
hosts library: the lane of a queue member and a lane's range of the queue; the
keys and locals below are what lib/lanes.lua (the bookkeeping itself) works on.
Included by every script that moves a request between the queue and in-flight.

A queue member is  lane \0 priority key (10) order key (15) payload ; all members
have score 0, so one lex range of the queue holds a lane's requests, highest
priority first, then FIFO (or LIFO) by order key.

The including script declares these locals before the include line:
  hosts        ZSET  lane -> time (ms) it may next be leased; holds exactly the lanes
                     with queued requests and a free slot
  busy         HASH  lane -> requests in flight fleet-wide
  backlog      HASH  lane -> requests queued
  host_next    HASH  lane -> earliest time (ms) of its next fetch (end of the last
                     fetch + delay, or a Retry-After block)
  concurrency  number, most requests of one lane in flight fleet-wide
  now_ms       number, Redis TIME in ms
]]
local function member_lane(member)
    local sep = string.find(member, "\0", 1, true)
    if not sep then
        return nil, nil
    end
    local key = string.sub(member, sep + 11, sep + 25)
    if #key ~= 15 or not string.match(key, "^%d+$") then
        return nil, nil
    end
    return string.sub(member, 1, sep - 1), key
end

local function lane_range(lane)
    return "[" .. lane .. "\0", "(" .. lane .. "\1"
end
