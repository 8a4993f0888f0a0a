-- quarantine.lua: the messages of an expired claim wait in K_QUARANTINE, each with the
-- size of the claim it may next be taken in (see claim.lua): half the expired claim's,
-- down to one, a claim of its own ("q<token>"), whose expiry alone counts as an attempt.
-- A claim of several quarantined messages is a group ("g<token>").

-- The due ids a claim of up to `batch` takes, in order, given their `scores` (the
-- seed layout's, else nil): quarantined ones are passed over, but for one group taken
-- first when `mode` allows it ("groups", or "alone" which also allows a message that
-- may only be claimed alone). A message that waits with the serial key of one passed
-- over is passed over too: the key's messages start in due order. Returns the ids,
-- their scores, the group's ids as a set, its kind ('q', 'g' or nil), and 1 if a
-- quarantined message was passed over, else 0.
local function pass_quarantined(ids, scores, batch, mode)
  local sizes = redis.call('HMGET', K_QUARANTINE, unpack(ids))
  local group, cap, others, passed, alone = {}, 0, {}, {}, false
  for i = 1, #ids do
    -- A size that does not read (a hand edit) counts as one.
    local size = sizes[i] and (tonumber(sizes[i]) or 1)
    if not size then
      others[#others + 1] = i
    elseif #group == 0 and ((size > 1 and mode) or mode == 'alone') then
      group[1], cap, alone = i, math.min(size, batch), size == 1
    elseif #group + 1 <= math.min(cap, size) then
      group[#group + 1], cap = i, math.min(cap, size)
    else
      passed[#passed + 1] = i
    end
  end
  if #passed > 0 and #others > 0 and redis.call('EXISTS', K_SERIAL) == 1 then
    local held, kept = {}, {}
    local function key_of(i)
      return redis.call('HGET', K_SERIAL, ids[i])
    end
    for _, i in ipairs(passed) do
      local key = key_of(i)
      if key then
        held[key] = true
      end
    end
    for _, i in ipairs(others) do
      local key = next(held) and key_of(i)
      if not (key and held[key]) then
        kept[#kept + 1] = i
      end
    end
    others = kept
  end
  local kept, kept_scores, members = {}, scores and {}, {}
  for k = 1, #group do
    kept[k] = ids[group[k]]
    members[kept[k]] = true
  end
  for k = 1, math.min(#others, batch - #group) do
    kept[#kept + 1] = ids[others[k]]
  end
  if scores then
    for k = 1, #group do
      kept_scores[k] = scores[group[k]]
    end
    for k = 1, math.min(#others, batch - #group) do
      kept_scores[#group + k] = scores[others[k]]
    end
  end
  local kind = #group > 0 and (alone and 'q' or 'g') or nil
  return kept, kept_scores, members, kind, #passed > 0 and 1 or 0
end

-- The size of claim a quarantined message of an expired claim that held `n` may next
-- be taken in: half, down to one.
local function quarantine_size(n)
  return math.max(1, math.floor(n / 2))
end

-- Entries of messages that no longer wait (deleted by the recipe's own consumers,
-- which do not know the key): a page of them at a time.
local function sweep_quarantine()
  local page = redis.call('HSCAN', K_QUARANTINE, 0, 'COUNT', 100)[2]
  local stale = {}
  for i = 1, #page, 2 do
    if not redis.call('ZSCORE', K_SCHED, page[i]) then
      stale[#stale + 1] = page[i]
    end
  end
  if #stale > 0 then
    redis.call('HDEL', K_QUARANTINE, unpack(stale))
  end
end
