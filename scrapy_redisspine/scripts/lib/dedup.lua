--[[
dedup library: included (textually, by the loader) into scripts that must decide
"seen before?" atomically with what they do next.

dedup_add(fingerprint) -> 1 when the fingerprint is new (and is now recorded),
0 when it was seen before. Uses the locals dedup_seen (SET key), dedup_meta (HASH
key) and dedup_bloom (bitmap key), which the including script must declare from its
KEYS before the include line (Redis scripts may not create globals).

Mode "set" (default, no meta): SADD on the seen SET.
]]
local function dedup_add(fingerprint)
    return redis.call("SADD", dedup_seen, fingerprint)
end
