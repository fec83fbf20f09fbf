--[[
member library: the queue member format, built and read here alone on the Lua side
(members.py is the Python side; tests/unit/test_members.py checks that they agree).
Includes nothing. Needs nothing.

A queue member is  lane \0 priority key (5 characters) order key (15 digits) payload ;
all members have score 0, so one lex range of the queue holds a lane's requests,
highest priority first, then FIFO (or LIFO) by order key. A lane holds no NUL byte.
Members queued before issue 19 have a 10-digit priority key: its first byte, a digit,
is below ":", where every 5-character key starts (members.py builds the keys).

member_order_key(number, lifo) -> the 15-digit order key of the request numbered
    `number` (from `seq`); LIFO complements it, so that later requests sort first.
member_make(lane, priority_key, order_key, payload) -> the queue member.
member_lane(member) -> lane, order key; nil, nil if the member is malformed (no NUL,
    or no 15-digit order key where it belongs).
member_parts(member) -> lane, priority key, order key, payload; nil if malformed.
member_lane_at(text, first) -> the lane of the member that starts at byte `first` of
    `text` (an in-flight entry, say), read in place; false if it has no NUL. Checks
    no order key: for acks of members that were leased, so well formed.
lane_range(lane) -> the ZRANGEBYLEX bounds of the lane's requests.
]]
local member_format, member_find, member_match, member_sub, member_byte =
    string.format, string.find, string.match, string.sub, string.byte
local member_lifo_top = 999999999999999 -- 10^15 - 1: complements stay 15 digits
local member_order_digits = 15
local member_first_symbol = 58 -- ":", the least first byte of a 5-character priority key

-- Where the order key starts, counted from the NUL after the lane: after a 5-character
-- priority key, or a 10-digit one (a member queued before issue 19).
local function member_key_offset(member, sep)
    local first = member_byte(member, sep + 1)
    return (first and first < member_first_symbol) and 11 or 6
end

local function member_order_key(number, lifo)
    if lifo then
        number = member_lifo_top - number
    end
    return member_format("%015d", number)
end

local function member_make(lane, priority_key, order_key, payload)
    return lane .. "\0" .. priority_key .. order_key .. payload
end

local function member_lane(member)
    local sep = member_find(member, "\0", 1, true)
    if not sep then
        return nil, nil
    end
    local first = sep + member_key_offset(member, sep)
    local key = member_sub(member, first, first + member_order_digits - 1)
    if #key ~= member_order_digits or not member_match(key, "^%d+$") then
        return nil, nil
    end
    return member_sub(member, 1, sep - 1), key
end

local function member_parts(member)
    local lane, key = member_lane(member)
    if not lane then
        return nil
    end
    local sep = #lane + 1
    local first = sep + member_key_offset(member, sep)
    return lane, member_sub(member, sep + 1, first - 1), key,
        member_sub(member, first + member_order_digits)
end

local function member_lane_at(text, first)
    local sep = member_find(text, "\0", first, true)
    return sep and member_sub(text, first, sep - 1) or false
end

local function lane_range(lane)
    return "[" .. lane .. "\0", "(" .. lane .. "\1"
end
