--[[
heartbeat: record that a worker is alive, stamped with the server's clock so that
workers on machines with skewed clocks agree on who is stale.

KEYS[1]  workers   ZSET   worker id -> last heartbeat (ms, Redis TIME)

ARGV[1]  worker      worker id
ARGV[2]  timeout_ms  a worker silent for longer may have been swept

Returns 1 if the worker's previous heartbeat was recent, 0 if it was missing or
older than the timeout: a sweep may have requeued its leases (all of them, or
some when the sweep hit its limit), so the worker must hand back what it holds.
]]
-- #include clock
local workers = KEYS[1]
local worker, timeout_ms = ARGV[1], tonumber(ARGV[2])
local now_ms = clock_ms()
-- ZREM first (not denyoom): Redis checks maxmemory only before a script's first
-- write, and a heartbeat of a few bytes must not fail on a full Redis, or live
-- workers would be taken for dead.
local previous = redis.call("ZSCORE", workers, worker)
redis.call("ZREM", workers, worker)
redis.call("ZADD", workers, now_ms, worker)
local known = previous and tonumber(previous) >= now_ms - timeout_ms
return known and 1 or 0
