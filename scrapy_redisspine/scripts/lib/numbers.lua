--[[
numbers library: every number a script reads from a crawl key goes through here. A
value that is no number of its kind (written by an operator, a bug, another tool) is
treated as absent, or repaired to a safe value, and the repair is recorded, so no
script raises on it (after it already wrote something) and the worker can log it.
Includes clock. Needs nothing: the keys are arguments.

count_of(value) -> the count (an integer >= 0, below 2^53) in `value` as HGET/HMGET
    return it: 0 when the field is missing (false), nil when it holds anything else.
time_of(value) -> the same for any finite number (a time in ms, a delay in seconds).
numbers_note(key, field, value, became [, described]): record a repair of `field` of
    `key` ("" for a STRING key), which held `value` and now holds `became` (text);
    `described` (text) stands for the old value when there is none to quote.
numbers_drop(key, field, value): HDEL a field holding no number of its kind, and
    record it: the script then takes it as absent.
numbers_repairs() -> the repairs recorded by this script call, for its reply: at most
    20 strings "key field value -> became" (the value quoted, its first 40 bytes,
    each byte outside printable ASCII as "?"; field "-" for a STRING key), then one
    "... n more repairs" if there were more.
hincrby_checked(key, field, n) -> HINCRBY's reply; nil and the error's text when the
    field holds no integer (or would overflow) or the key is of the wrong type;
    other errors (out of memory ...) raise as HINCRBY would.
stats_add(stats, field, n): HINCRBY of a counter in the stats HASH. A field holding
    no integer restarts at n; a stats key of the wrong type is left alone and the
    lost count recorded: counters never fail a script after its writes.
seq_take(seq, n) -> the last of n numbers taken from `seq`, the STRING counter behind
    order keys, fencing tokens and dead letters' numbers. It never fails on the
    counter's value or type: nothing needs checking before the script's first write.

A `seq` holding no usable number (no integer as INCRBY reads them, a negative one,
one past the 15 digits of an order key, or a key of another type) is set to a number
larger than any it can have handed out:
the time since 2024-01-01 in ms, times 1000 (or the garbage read as a number, plus
one, if that is more). That assumes the fleet took fewer than a million numbers a
second on average since the counter started or was last repaired. Then order keys
stay unique (no dead letter is overwritten, no member is taken for a duplicate) and
fencing tokens stay fresh; FIFO keys still sort after every earlier request, LIFO
keys before.

Few functions and upvalues, on purpose: Redis runs the whole script text on every
call, and each closure it creates costs time in every call of every script that
includes the library (more so with each upvalue a closure takes).
]]
-- #include clock
local numbers_list = {} -- the repairs so far

local function count_of(value)
    if not value then
        return 0
    end
    local n = tonumber(value)
    if n and n >= 0 and n < 9007199254740992 and n % 1 == 0 then -- below 2^53
        return n
    end
    return nil
end

local function time_of(value)
    if not value then
        return 0
    end
    local n = tonumber(value)
    if n and n > -math.huge and n < math.huge then -- also false for NaN
        return n
    end
    return nil
end

local function numbers_note(key, field, value, became, described)
    if #numbers_list >= 20 then
        numbers_list.more = (numbers_list.more or 0) + 1 -- (not part of the reply)
        return
    end
    if not described then
        value = value and tostring(value) or ""
        described = '"' .. string.gsub(string.sub(value, 1, 40), "[^ -~]", "?")
            .. (#value > 40 and '..."' or '"')
    end
    numbers_list[#numbers_list + 1] = key .. " " .. (field == "" and "-" or field) .. " "
        .. described .. " -> " .. became
end

local function numbers_drop(key, field, value)
    redis.call("HDEL", key, field)
    numbers_note(key, field, value, "absent")
end

local function numbers_repairs()
    if numbers_list.more then
        numbers_list[#numbers_list + 1] = "... " .. numbers_list.more .. " more repairs"
        numbers_list.more = nil
    end
    return numbers_list
end

local function hincrby_checked(key, field, n)
    local reply = redis.pcall("HINCRBY", key, field, n)
    if type(reply) ~= "table" then
        return reply
    end
    local message = tostring(reply.err)
    for _, fault in ipairs({ "WRONGTYPE", "integer", "overflow" }) do
        if string.find(message, fault, 1, true) then
            return nil, message
        end
    end
    error(reply) -- not the value's fault (e.g. out of memory at a first write)
end

local function stats_add(stats, field, n)
    local counted, message = hincrby_checked(stats, field, n)
    if counted then
        return
    end
    if string.find(message, "WRONGTYPE", 1, true) then
        numbers_note(stats, field, nil, "+" .. n .. " not counted", "(the key holds no HASH)")
        return
    end
    local old = redis.call("HGET", stats, field)
    redis.call("HSET", stats, field, n)
    numbers_note(stats, field, old, tostring(n))
end

local function seq_take(seq, n)
    local last = redis.pcall("INCRBY", seq, n)
    if type(last) == "number" and last >= n and last <= 999999999999999 then
        return last -- the 15 digits of an order key hold it
    end
    local raw, described
    if type(last) == "number" then
        raw = string.format("%d", last - n) -- a number out of range: negative, or too big
    elseif string.find(tostring(last.err), "WRONGTYPE", 1, true) then
        described = "(the key holds no STRING)"
        redis.call("DEL", seq)
    elseif string.find(tostring(last.err), "integer", 1, true) then
        raw = redis.call("GET", seq)
    else
        error(last) -- not the value's fault (e.g. out of memory at a first write)
    end
    local first = (clock_ms() - 1704067200000) * 1000 -- since 2024-01-01, see above
    local read = tonumber(raw or "")
    if read and read >= first and read + n < 999999999999999 then
        first = math.floor(read) + 1
    end
    last = string.format("%d", math.max(first, 1) + n - 1)
    redis.call("SET", seq, last)
    numbers_note(seq, "", raw, last, described)
    return tonumber(last)
end
