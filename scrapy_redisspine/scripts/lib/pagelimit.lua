--[[
pagelimit library: REDISSPINE_HOST_PAGE_LIMIT, the requests one lane leases over the
whole crawl, fleet-wide. lease.lua counts each lease and drops what a spent lane
still has queued; a lease put back unfetched (lib/putback.lua) gives its page back.
Includes batch, numbers, lists, lanes. Needs lanes_init called first (by the script).

page_limit_read(lane_pages, lanes) -> lane -> requests it leased so far; a count that
  is no number is dropped and recorded (lib/numbers.lua): the lane starts from 0
page_limit_add(lane_pages, lanes, pages_of, moved): each lane's count becomes
  pages_of[lane] + moved[lane] (one HSET for all)
page_limit_drop(queue, backlog, lanes) -> how many queued requests of these spent
  lanes left the queue; each lane's backlog count goes with them and the lane leaves
  `hosts` (until requests arrive again)
page_limit_give_back(lane_pages, lane): one lease of the lane was never fetched
]]
-- #include batch
-- #include numbers
-- #include lists
-- #include lanes
local function page_limit_read(lane_pages, lanes)
    local raw, pages_of = hmget_in_chunks(lane_pages, lanes), {}
    for i, lane in ipairs(lanes) do
        local pages = count_of(raw[i])
        if not pages then
            numbers_drop(lane_pages, lane, raw[i])
            pages = 0
        end
        pages_of[lane] = pages
    end
    return pages_of
end

local function page_limit_add(lane_pages, lanes, pages_of, moved)
    local pairs_ = {}
    for _, lane in ipairs(lanes) do
        pairs_[#pairs_ + 1] = lane
        pairs_[#pairs_ + 1] = pages_of[lane] + moved[lane]
    end
    call_in_chunks("HSET", lane_pages, pairs_)
end

local function page_limit_drop(queue, backlog, lanes)
    local dropped = 0
    for _, lane in ipairs(lanes) do
        dropped = dropped + lists_drop_lane(queue, lane) -- its lists and members
        redis.call("HDEL", backlog, lane) -- absent is 0: nothing queued
        host_schedule(lane)
    end
    return dropped
end

local function page_limit_give_back(lane_pages, lane)
    local pages = count_of(redis.call("HGET", lane_pages, lane))
    if pages and pages > 0 then
        redis.call("HSET", lane_pages, lane, pages - 1)
    end
end
