--[[
batch library: one redis.call for many items. Inside a script each redis.call costs
about a microsecond of its own besides the command's work, so hot scripts gather
the writes of a whole batch (HSET pairs, ZADD pairs, ZREM members ...) and send
them here, and read many fields with one HMGET. Chunks of at most 1000 arguments
stay far below Lua's C stack limit (about 8000 values for one unpack); an even size
keeps pairs together.
Includes nothing. Needs nothing: the keys are arguments.

call_in_chunks(command, key, args [, flag]) -- flag: e.g. "NX", right after the key
hmget_in_chunks(key, fields) -> values, in the order of fields (false when missing)
]]
local function call_in_chunks(command, key, args, flag)
    for i = 1, #args, 1000 do
        if flag then
            redis.call(command, key, flag, unpack(args, i, math.min(i + 999, #args)))
        else
            redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
        end
    end
end

local function hmget_in_chunks(key, fields)
    if #fields <= 1000 then
        if #fields == 0 then
            return {}
        end
        return redis.call("HMGET", key, unpack(fields)) -- one chunk: its reply as it is
    end
    local values = {}
    for i = 1, #fields, 1000 do
        local chunk = redis.call("HMGET", key, unpack(fields, i, math.min(i + 999, #fields)))
        for j = 1, #chunk do
            values[#values + 1] = chunk[j]
        end
    end
    return values
end
