--[[
keytypes library: fail before the first write when a key holds the wrong type. A
command on such a key fails (WRONGTYPE) wherever it comes, and a script that fails
after it wrote something leaves its work half done: a lease recorded in in-flight
but in no index, acks applied but their children not queued. So each script checks,
before its first write, the keys that it would otherwise first touch after it. A
key that the script reads before its first write anyway is checked by that read.
Includes nothing. Needs nothing: the keys are arguments.

key_exists(key, type) -> whether the key exists, for a type of "hash", "zset",
    "set", "string" or "stream" (a STRING holding "" counts as absent); a key that exists
    with another type fails the script, naming it.
keys_expect(key, type, key, type ...): key_exists of each, once per key and type in a
    script call (a lease that carries acks checks leases and owned for both: the
    script itself only ever writes a key with its own type, and nothing else runs
    in between).

The check is the type's O(1) length command (HLEN, ZCARD, SCARD, STRLEN, XLEN): an integer
reply, cheaper than TYPE's status reply, and as cheap as EXISTS.
]]
local keytypes_length = { hash = "HLEN", zset = "ZCARD", set = "SCARD", string = "STRLEN",
                          stream = "XLEN" }

local function key_exists(key, expected)
    local length = redis.pcall(keytypes_length[expected], key)
    if type(length) == "table" then
        error("Redis key " .. key .. " holds a " .. redis.call("TYPE", key).ok .. ", expected a "
              .. expected .. "; it was not written by scrapy_redisspine. Delete it or use "
              .. "another crawl id.")
    end
    return length > 0
end

local keytypes_checked = {} -- key -> the type keys_expect found it of (or absent)

local function keys_expect(...)
    local expected = { ... }
    for i = 1, #expected, 2 do
        local key, kind = expected[i], expected[i + 1]
        if keytypes_checked[key] ~= kind then
            key_exists(key, kind)
            keytypes_checked[key] = kind
        end
    end
end
