--[[
batch library: one redis.call for many items. Inside a script each redis.call costs
about a microsecond of its own besides the command's work, so hot scripts gather
the writes of a whole batch (HSET pairs, ZADD pairs, ZREM members ...) and send
them here. Chunks of at most 1000 arguments stay far below Lua's C stack limit
(about 8000 values for one unpack); an even size keeps pairs together.
]]
local function call_in_chunks(command, key, args)
    for i = 1, #args, 1000 do
        redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
    end
end
