--[[
hashed library: the frontier's busiest HASHes and ZSETs leave Redis's packed encoding
once they hold more than 16 entries, whatever the server's thresholds.

Why. Redis keeps a small HASH or ZSET as one packed list (listpack; ziplist on Redis
6.2) up to hash-max-listpack-entries (default 512) / zset-max-listpack-entries (128)
entries, and finds a field or a member in it by a scan. The keys with a field per
lane (busy, backlog, hosts, ...) or a member per lease (leases, owned) are read and
written on every lease and ack, so a crawl of 16 to 512 hosts, or a fleet with that
many requests in flight, pays a scan of up to hundreds of entries per field: a ZADD
of 16 lanes into a 100-entry packed ZSET costs ~10x what it costs in a skiplist
(benchmarks/RESULTS.md, sessions 17 and 20). The server-wide thresholds of 16 in
Operations end that, but they are a setting a user must find and may not own (a
managed Redis); this does the same for the crawl's own keys, and nothing else.

How. A packed key past the limit gets one entry too long to be packed (a member or
field longer than any *-max-listpack-value), which makes Redis convert it, and the
entry is taken out again in the same call: no other client, script or replica ever
sees it (both writes replicate inside the script's transaction). Redis never packs
a key again as it shrinks; a restart (RDB or AOF load) may, and the key is converted
again the next time a script sets an entry in it (a key that only shrinks stays
packed: it is scanned less and less). The entry goes in with NX: were it somehow a
real entry already, it is left alone (it forced the conversion itself).

Called only after the script set entries in the key (HSET, ZADD): a write has already
passed Redis's memory check, so on a full Redis (maxmemory, noeviction) these writes
are never the call's first, the one Redis refuses.
Includes nothing. Needs nothing: the keys are arguments.

hashed_keep(key, kind, written) -- kind "hash" or "zset": convert key if it is packed
  and holds more than hashed_above entries; checked at most once per key per script
  call. `written`, if given, is how many arguments the call's writes to the key had:
  0 (nothing set) asks nothing. A
  server that refuses OBJECT ENCODING (an ACL, a renamed command, fakeredis) is
  not asked again in the call and its keys stay as they are: slower, never wrong,
  and `redisspine status` names keys left packed (its hint line).
]]
-- Two locals only: a script's main chunk may hold at most 200, and enqueue.lua's is
-- near that. checked: key -> true once looked at in this call; refused: OBJECT
-- ENCODING was refused once in this call.
local hashed_state = { checked = {}, refused = false }

local function hashed_keep(key, kind, written)
    -- connection.PACKED_ENTRIES_MAX: the embedded server's thresholds, status's hint.
    local hashed_above = 16
    if written == 0 or hashed_state.refused or hashed_state.checked[key] then
        return
    end
    hashed_state.checked[key] = true
    -- A server that refuses OBJECT (an ACL, a managed Redis that renames it, fakeredis)
    -- keeps its packed keys: slower, not wrong. Not asked again in this call.
    local encoding = redis.pcall("OBJECT", "ENCODING", key)
    if type(encoding) == "table" then
        hashed_state.refused = true
        return
    end
    if encoding ~= "listpack" and encoding ~= "ziplist" then
        return
    end
    if redis.call(kind == "zset" and "ZCARD" or "HLEN", key) <= hashed_above then
        return
    end
    -- Far longer than Redis's and Valkey's default *-max-listpack-value (64) and than
    -- any lane or member; a NUL first, which no lane or member of the frontier starts
    -- with. Made only when a key is converted (once per key and server start).
    local entry = "\0redisspine: converts a packed key, never stays" .. string.rep("-", 2000)
    if kind == "zset" then
        if redis.call("ZADD", key, "NX", 0, entry) == 1 then
            redis.call("ZREM", key, entry)
        end
    elseif redis.call("HSETNX", key, entry, "") == 1 then
        redis.call("HDEL", key, entry)
    end
end
