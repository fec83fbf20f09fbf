--[[
entry library: read in-flight entries ("owner \n token \n queue member"), so the
fencing rule lives in one place. Requires the local `inflight` (HASH key).

fenced_member(key, owner, token) -> the queue member if the lease `key` is still
held by `owner` under `token`, else nil (acked, requeued, or leased again since).
entry_member(entry, owner, token) -> the same, from an entry already read (or false).
entry_lane(entry, owner, token) -> the lane of such an entry (false if its member has
none), or nil when it is not fenced.
entry_parts(entry) -> owner, queue member.
lease_end(owner, key): remove the lease from inflight, leases and owned.
]]
local function entry_member(entry, owner, token)
    local prefix = owner .. "\n" .. token .. "\n"
    if entry and string.sub(entry, 1, #prefix) == prefix then
        return string.sub(entry, #prefix + 1)
    end
    return nil
end

-- The lane of a fenced entry, read in place (no copy of the member): for acks.
local function entry_lane(entry, owner, token)
    local prefix = owner .. "\n" .. token .. "\n"
    if not entry or string.sub(entry, 1, #prefix) ~= prefix then
        return nil
    end
    local sep = string.find(entry, "\0", #prefix + 1, true)
    return sep and string.sub(entry, #prefix + 1, sep - 1) or false
end

local function fenced_member(key, owner, token)
    return entry_member(redis.call("HGET", inflight, key), owner, token)
end

-- The lease `key` of `owner` ends: out of in-flight and its two indexes. Requires
-- the locals leases and owned (keys) too.
local function lease_end(owner, key)
    redis.call("HDEL", inflight, key)
    redis.call("ZREM", leases, key)
    redis.call("ZREM", owned, owner .. "\n" .. key)
end

local function entry_parts(entry)
    local owner_end = string.find(entry, "\n", 1, true)
    local token_end = string.find(entry, "\n", owner_end + 1, true)
    return string.sub(entry, 1, owner_end - 1), string.sub(entry, token_end + 1)
end
