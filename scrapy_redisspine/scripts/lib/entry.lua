--[[
entry library: read and end in-flight entries ("owner \n token \n queue member"), so
the fencing rule lives in one place.
Includes member, numbers. Needs entry_init called first (by the script) for the
functions that touch keys (entry_get, fenced_member, lease_end, lease_forget,
entry_bury_malformed); the readers of an entry already read need nothing.

entry_init(inflight, leases, owned)
  inflight  HASH  order key -> owner \n token \n member
  leases    ZSET  order key -> lease time (ms)
  owned     ZSET  score 0, member owner \n order key

entry_get(key) -> the entry of the lease `key`, or false.
fenced_member(key, owner, token) -> the queue member if the lease `key` is still
held by `owner` under `token`, else nil (acked, requeued, or leased again since).
entry_member(entry, owner, token) -> the same, from an entry already read (or false).
entry_lane(entry, owner, token) -> the lane of such an entry (false if its member has
none), or nil when it is not fenced.
entry_parts(entry) -> owner, queue member; nil if the entry is no "owner \n token \n
    member" (not written by lease.lua).
lease_end(owner, key): remove the lease from inflight, leases and owned.
lease_forget(key [, owner]): remove a lease's index entries (its time in leases; its
    owner's entry in owned, if the owner is known) when its entry is gone already.
entry_bury_malformed(dead, key, entry [, owner]): move an entry that entry_parts cannot
    read to the dead letters (HASH `dead`, under its key: reason \n entry), out of
    in-flight and its indexes, and record it (lib/numbers.lua). Its lane cannot be
    known: the lane's busy count heals when nothing is in flight (lease.lua).
]]
-- #include member
-- #include numbers
local entry_inflight, entry_leases, entry_owned

local function entry_init(inflight, leases, owned)
    if not (inflight and leases and owned) then
        error("entry_init: a key is missing")
    end
    entry_inflight, entry_leases, entry_owned = inflight, leases, owned
end

local function entry_get(key)
    return redis.call("HGET", entry_inflight, key)
end

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
    return member_lane_at(entry, #prefix + 1)
end

local function fenced_member(key, owner, token)
    return entry_member(entry_get(key), owner, token)
end

-- The lease `key` of `owner` ends: out of in-flight and its two indexes.
local function lease_end(owner, key)
    redis.call("HDEL", entry_inflight, key)
    redis.call("ZREM", entry_leases, key)
    redis.call("ZREM", entry_owned, owner .. "\n" .. key)
end

local function lease_forget(key, owner)
    redis.call("ZREM", entry_leases, key)
    if owner then
        redis.call("ZREM", entry_owned, owner .. "\n" .. key)
    end
end

local function entry_parts(entry)
    local owner_end = string.find(entry, "\n", 1, true)
    local token_end = owner_end and string.find(entry, "\n", owner_end + 1, true)
    if not token_end then
        return nil
    end
    return string.sub(entry, 1, owner_end - 1), string.sub(entry, token_end + 1)
end

local function entry_bury_malformed(dead, key, entry, owner)
    redis.call("HSET", dead, key, "malformed in-flight entry\n" .. entry)
    redis.call("HDEL", entry_inflight, key)
    lease_forget(key, owner)
    numbers_note(entry_inflight, key, entry, "dead letter " .. key)
end
