--[[
heartbeat: record that a worker is alive, stamped with the server's clock so that
workers on machines with skewed clocks agree on who is stale.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)

ARGV[1]  worker    worker id

Returns the heartbeat time in ms.
]]
local workers = KEYS[1]
local worker = ARGV[1]

local time = redis.call("TIME")
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call("ZADD", workers, now_ms, worker)
return now_ms
