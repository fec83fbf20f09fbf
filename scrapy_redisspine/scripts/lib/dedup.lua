--[[
dedup library: for scripts that must decide "seen before?" atomically with what
they do next.
Includes numbers, keytypes. Needs dedup_init called first (by the script).

dedup_init(seen, dedup, bloom) -> mode, impl: the HASH's fields below (mode "set" if none)
  seen   SET    raw fingerprints (mode "set", drained while "migrating")
  dedup  HASH   mode and filter parameters (written by dedup_switch.lua)
  bloom  STRING the Bloom filter: a bitmap, or a RedisBloom filter
dedup_add(fingerprint) -> 1 when the fingerprint is new (and is now recorded),
0 when it was seen before (or is a Bloom false positive).
dedup_filter_add(fingerprint) -> the same for the filter alone (migrate_dedup.lua).
dedup_add_all(fingerprints) -> a table of what dedup_add would return for each
fingerprint in turn (a repeat within the list is seen), in fewer calls where the mode
allows: RedisBloom in mode "bloom" takes them all in one BF.MADD per 1000 (issue 19:
each command called from Lua costs about a microsecond of its own, the lookup itself
less than that).

The meta HASH (`dedup`) is read and checked once, by dedup_init, with the bitmap's
type and length: a script calls it before any write of its own, so a corrupt HASH or
bitmap aborts the script before it changed anything (the type of `seen` is the
script's to check, if it writes elsewhere first: enqueue.lua).
Only the layers in use, and the next one planned (a script may grow into it), are
parsed. A layer's count that is no number is repaired (lib/numbers.lua) to the
layer's capacity: the layer is taken as full, so the filter grows now, never as
empty (an overfull layer would take new fingerprints for seen ones). Fields:
  mode        "set" (or no HASH at all) | "migrating" | "bloom"
  impl        "bitmap" | "redisbloom"                (not in mode "set")
  block_bytes bitmap: bytes per block (all of a fingerprint's bits are in one)
  layers      bitmap: layers in use (the last one takes new fingerprints)
  max_layers  bitmap: layers planned (bloom.py's plan_layers)
  layer:<i>   bitmap: "offset blocks hashes capacity step placement" of layer i
              (offset in bytes; placement 2; a layer of a filter created before
              placement 2 has the first five fields: placement 1, see below)
  count:<i>   bitmap: fingerprints added to layer i (sampled: see bloom.py)

The SET holds a 20-byte fingerprint (a SHA1 digest: Scrapy's, or what the
dupefilter makes of any other) as its first 14 bytes: a 112-bit prefix of a digest
cannot collide in any crawl (odds below 10^-17 at 10^8 URLs), and a 14-byte member
fits the allocator's 16-byte class where a 20-byte one takes 24 or 32 bytes: about
56 instead of 72 bytes per URL on Redis 7.0. Fingerprints of any other length are
not digests (hand-made by tools and tests) and are kept whole. The Bloom filter
reads only bytes 1 to 12, so a member moved from the SET lands on the same bits as
its whole fingerprint.

Modes:
  set        SADD on the SET.
  migrating  the SET is being moved into the filter (migrate_dedup.lua): a
             fingerprint is seen if the SET or the filter has it; new ones go to
             the filter only. Every fingerprint is in one of the two at all times.
  bloom      the filter alone.

Bitmap filter (blocked, scalable; the arithmetic is bloom.py's, see its docstring):
a fingerprint's bits in a layer all lie in one block, read with one GETRANGE. Four
9-bit coefficients a, b, c, d from h2 place them (placement 2: 2^36 patterns in a
block); placement 1 has a and b only (2^18 patterns, which floors the error rate at
~4e-5 whatever was asked: bloom.py). It is
seen if all its bits are set in the block of any layer; a new one is written to the
last layer with one SETRANGE of the bytes that change. When that layer reaches its
capacity the next planned layer (allocated here, zeroed) takes over.
]]
-- #include numbers
-- #include keytypes
local dedup_byte, dedup_char, dedup_format, dedup_sub = string.byte, string.char, string.format, string.sub
local dedup_digest_bytes, dedup_member_bytes = 20, 14 -- a digest, and what the SET keeps of it
local dedup_masks = { 128, 64, 32, 16, 8, 4, 2, 1 } -- bit i of a byte, as Redis numbers it

local dedup_seen, dedup_meta, dedup_bloom -- the keys, set by dedup_init

local function dedup_fail(message)
    error("dedup key " .. dedup_meta .. ": " .. message)
end

-- The state, read once per script call. Hot values live in locals (upvalues of
-- the functions below): table lookups per fingerprint add up.
local dedup_state = {}
local dedup_block_bytes, dedup_block_bits, dedup_active, dedup_planned = 0, 0, 0, 0
local dedup_layers = {}

local function dedup_load_layer(i)
    local offset, blocks, hashes, capacity, step, placement = string.match(
        redis.call("HGET", dedup_meta, "layer:" .. i) or "", "^(%d+) (%d+) (%d+) (%d+) (%d+)(.*)$")
    if not step or (placement ~= "" and placement ~= " 2")
        or tonumber(blocks) < 1 or tonumber(hashes) < 1 or tonumber(step) < 1 then
        dedup_fail("bad spec of layer " .. i)
    end
    -- split: the bits a and b place (c and d the rest); shift: h2's digits under it
    -- place bits, those above sample the count. No sixth field: placement 1.
    local split, shift = tonumber(hashes), dedup_block_bits ^ 2
    if placement == " 2" then
        split, shift = math.floor((split + 1) / 2), dedup_block_bits ^ 4
    end
    dedup_layers[i] = {
        offset = tonumber(offset), blocks = tonumber(blocks), hashes = tonumber(hashes),
        capacity = tonumber(capacity), step = tonumber(step), count_field = "count:" .. i,
        split = split, count_shift = shift,
    }
end

local function dedup_load()
    local meta = redis.call("HMGET", dedup_meta, "mode", "impl", "block_bytes", "layers", "max_layers")
    local mode, impl = meta[1] or "set", meta[2]
    dedup_state.mode, dedup_state.impl = mode, impl
    if mode == "set" then
        return
    end
    if mode ~= "migrating" and mode ~= "bloom" then
        dedup_fail("unknown mode " .. tostring(mode))
    end
    if impl == "redisbloom" then
        return
    end
    if impl ~= "bitmap" then
        dedup_fail("unknown filter implementation " .. tostring(impl))
    end
    local block_bytes, active, planned = tonumber(meta[3]), tonumber(meta[4]), tonumber(meta[5])
    if not block_bytes or block_bytes < 1 then
        dedup_fail("bad block size " .. tostring(meta[3]))
    end
    if not active or not planned or active < 1 or active > planned then
        dedup_fail("bad layer count " .. tostring(meta[4]) .. "/" .. tostring(meta[5]))
    end
    dedup_block_bytes, dedup_block_bits = block_bytes, block_bytes * 8
    dedup_active, dedup_planned = active, planned
    -- The next layer too, if one is planned: growing into it must not fail mid-script.
    for i = 1, math.min(active + 1, planned) do
        dedup_load_layer(i)
    end
    local last = dedup_layers[active]
    key_exists(dedup_bloom, "string")
    if redis.call("STRLEN", dedup_bloom) < last.offset + last.blocks * block_bytes then
        dedup_fail("Bloom bitmap " .. dedup_bloom .. " is shorter than its layers")
    end
end

local function dedup_init(seen, dedup, bloom)
    if not (seen and dedup and bloom) then
        error("dedup_init: a key is missing")
    end
    dedup_seen, dedup_meta, dedup_bloom = seen, dedup, bloom
    dedup_load()
    return dedup_state.mode, dedup_state.impl
end

-- Two 48-bit hashes from the fingerprint's first 12 bytes (it is a digest already);
-- a fingerprint shorter than that (hand-made) is mixed instead, as bloom.py does.
local function dedup_hashes(fingerprint)
    local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = dedup_byte(fingerprint, 1, 12)
    if b12 then
        return ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6,
            ((((b7 * 256 + b8) * 256 + b9) * 256 + b10) * 256 + b11) * 256 + b12
    end
    local first, second = 5381, 52711
    for i = 1, #fingerprint do
        local byte = dedup_byte(fingerprint, i)
        first = (first * 33 + byte) % 4294967296
        second = (second * 65599 + byte) % 4294967296
    end
    return first, second
end

-- The fingerprint's block in `layer`: its first byte, and its bytes.
local function dedup_block(layer, first)
    local start = layer.offset + (first % layer.blocks) * dedup_block_bytes
    local block = redis.call("GETRANGE", dedup_bloom, dedup_format("%d", start),
        dedup_format("%d", start + dedup_block_bytes - 1))
    if #block < dedup_block_bytes then
        dedup_fail("Bloom bitmap " .. dedup_bloom .. " is shorter than its layers")
    end
    return start, block
end

-- Bytes changed by dedup_block_check, reused across fingerprints (no garbage).
local dedup_changed, dedup_touched = {}, {}

-- Whether all of the layer's bits (x + j*y + (j^3 - j)/6) mod block_bits were set in
-- block, (x, y) = (a, b) for j below its split, (c, d) from there. Given `start` (the
-- block's first byte in the bitmap), it sets those that were not, with one SETRANGE
-- of the span of bytes that change; without, it only tests (and stops at the first
-- bit not set).
local function dedup_block_check(block, layer, a, b, c, d, start)
    local bits, masks, split = dedup_block_bits, dedup_masks, layer.split
    local changed, touched = dedup_changed, dedup_touched
    local n, low, high = 0, 65536, 0
    local x, y = a, b
    for j = 0, layer.hashes - 1 do
        if j == split then
            x, y = c, d
        end
        local position = (x + j * y + (j * j * j - j) / 6) % bits
        local bit = position % 8
        local mask = masks[bit + 1]
        local index = (position - bit) / 8 + 1
        local value = changed[index] or dedup_byte(block, index)
        if value % (mask + mask) < mask then
            if not start then
                return false
            end
            if not changed[index] then
                n = n + 1
                touched[n] = index
                if index < low then low = index end
                if index > high then high = index end
            end
            changed[index] = value + mask
        end
    end
    if n == 0 then
        return true
    end
    local bytes = { dedup_byte(block, low, high) }
    for i = 1, n do
        local index = touched[i]
        bytes[index - low + 1] = changed[index]
        changed[index] = nil
    end
    redis.call("SETRANGE", dedup_bloom, dedup_format("%d", start + low - 1), dedup_char(unpack(bytes)))
    return false
end

local function dedup_grow()
    dedup_active = dedup_active + 1
    dedup_load_layer(dedup_active)
    local layer = dedup_layers[dedup_active]
    redis.call("HSET", dedup_meta, "layers", dedup_active)
    -- Allocate the whole layer now (zeroed), so the bitmap's size says what it holds.
    local last = layer.offset + layer.blocks * dedup_block_bytes - 1
    redis.call("SETRANGE", dedup_bloom, dedup_format("%d", last), "\0")
end

local function dedup_bitmap_add(fingerprint)
    local first, second = dedup_hashes(fingerprint)
    local bits = dedup_block_bits
    -- h2's 9-bit digits from the lowest
    local a = second % bits
    local rest = (second - a) / bits
    local b = rest % bits
    rest = (rest - b) / bits
    local c = rest % bits
    local d = ((rest - c) / bits) % bits
    for l = 1, dedup_active - 1 do
        local layer = dedup_layers[l]
        local _, block = dedup_block(layer, first)
        if dedup_block_check(block, layer, a, b, c, d) then
            return 0
        end
    end
    local layer = dedup_layers[dedup_active]
    local start, block = dedup_block(layer, first)
    if dedup_block_check(block, layer, a, b, c, d, start) then
        return 0
    end
    -- Sampled count: the digits of h2 above those that placed the bits (bloom.py).
    local step, above = layer.step, layer.count_shift
    if step == 1 or ((second - second % above) / above) % step == 0 then
        local count = hincrby_checked(dedup_meta, layer.count_field, step)
        if not count then -- no number (see above): taken as full
            count = layer.capacity
            local old = redis.call("HGET", dedup_meta, layer.count_field)
            redis.call("HSET", dedup_meta, layer.count_field, count)
            numbers_note(dedup_meta, layer.count_field, old, count .. " (the layer's capacity)")
        end
        if count >= layer.capacity and dedup_active < dedup_planned then
            dedup_grow()
        end
    end
    return 1
end

-- What the SET stores of a fingerprint (see above).
local function dedup_member(fingerprint)
    if #fingerprint == dedup_digest_bytes then
        return dedup_sub(fingerprint, 1, dedup_member_bytes)
    end
    return fingerprint
end

-- Add to the filter alone (no SET check): 1 if new, 0 if (probably) seen.
-- RedisBloom hashes the whole item, so it gets the SET's form of the fingerprint:
-- the members migrate_dedup.lua moves over and later adds then agree.
local function dedup_filter_add(fingerprint)
    if dedup_state.impl == "redisbloom" then
        return redis.call("BF.ADD", dedup_bloom, dedup_member(fingerprint))
    end
    return dedup_bitmap_add(fingerprint)
end

local function dedup_add(fingerprint)
    local mode = dedup_state.mode
    if mode == "set" then
        return redis.call("SADD", dedup_seen, dedup_member(fingerprint))
    end
    if mode == "migrating" and redis.call("SISMEMBER", dedup_seen, dedup_member(fingerprint)) == 1 then
        return 0
    end
    return dedup_filter_add(fingerprint)
end

local function dedup_add_all(fingerprints)
    local news = {}
    if dedup_state.mode ~= "bloom" or dedup_state.impl ~= "redisbloom" then
        for i = 1, #fingerprints do
            news[i] = dedup_add(fingerprints[i])
        end
        return news
    end
    local members = {}
    for i = 1, #fingerprints do
        members[i] = dedup_member(fingerprints[i])
    end
    for i = 1, #members, 1000 do
        local replies = redis.call("BF.MADD", dedup_bloom, unpack(members, i, math.min(i + 999, #members)))
        for j = 1, #replies do
            news[#news + 1] = replies[j]
        end
    end
    return news
end
