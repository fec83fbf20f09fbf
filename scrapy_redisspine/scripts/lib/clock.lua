--[[
clock library: the one clock of every script.
Includes nothing. Needs nothing.

Redis TIME, not the workers' clocks: workers on machines with skewed clocks then
agree on heartbeats, lease ages and when a lane is due.

clock_ms() -> the server's time in whole milliseconds.
]]
local function clock_ms()
    local time = redis.call("TIME")
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
