--[[
crawl library: is the crawl in Redis still the one the caller joined?
Includes nothing. Needs nothing.

Every worker learns its crawl's epoch when it registers (register.lua) and presents
it; a crawl whose keys vanished (Redis restarted without persistence, flushed,
failed over to an empty replica) or were purged must never be taken for a
finished one, nor be re-created piecemeal by the writes of workers that did not
notice.

crawl_status(record, epoch) -> "ok", "lost" (no record), "purged" (only the
tombstone `redisspine purge` leaves) or "changed" (another epoch: the crawl was
started afresh). An empty epoch (a tool outside the fleet) is always "ok".
crawl_refusal(record, epoch) -> nil when the crawl is the caller's, else the error
reply a writing script returns at once ("LOST <status>"), having written nothing.
]]
local function crawl_status(record, epoch)
    if epoch == "" then
        return "ok"
    end
    local known = redis.call("HMGET", record, "epoch", "purged_ms")
    if not known[1] then
        return known[2] and "purged" or "lost"
    end
    return known[1] == epoch and "ok" or "changed"
end

local function crawl_refusal(record, epoch)
    local status = crawl_status(record, epoch)
    if status ~= "ok" then
        return redis.error_reply("LOST " .. status)
    end
    return nil
end
