--[[
group library: a crawl leaves its politeness group's in-flight counts.
Includes batch, numbers. Needs nothing: the keys are arguments.

group_forget(busy, group_busy) -> how many lanes' counts it took out: each lane's
  count in the crawl's `busy` (its requests in flight) is taken out of the group's
  `group_busy` (never below 0). Called where a crawl's `busy` is deleted or found
  wrong while its requests are not in flight (a purge, a flush, the lease's repair
  of counts with nothing in flight): else those slots would stay held, group-wide,
  for every other crawl of the group, forever. A count that is no number in either
  HASH counts as 0 (and is repaired: numbers.lua).
]]
-- #include batch
-- #include numbers

local function group_forget(busy, group_busy)
    local flat = redis.call("HGETALL", busy)
    local lanes, held = {}, {}
    for i = 1, #flat, 2 do
        local count = count_of(flat[i + 1])
        if count and count > 0 then
            lanes[#lanes + 1] = flat[i]
            held[#held + 1] = count
        end
    end
    if #lanes == 0 then
        return 0
    end
    local before = hmget_in_chunks(group_busy, lanes)
    local set, del = {}, {}
    for i, lane in ipairs(lanes) do
        local left = (count_of(before[i]) or 0) - held[i]
        if not count_of(before[i]) then
            numbers_note(group_busy, lane, before[i], "absent")
        end
        if left > 0 then
            set[#set + 1] = lane
            set[#set + 1] = left
        else
            del[#del + 1] = lane
        end
    end
    call_in_chunks("HDEL", group_busy, del)
    call_in_chunks("HSET", group_busy, set)
    return #lanes
end
