-- quarantine.lua: the messages of an expired claim wait in K_QUARANTINE, each with the
-- size of the claim it may next be taken in (see claim.lua): half the expired claim's,
-- down to one, a claim of its own ("q<token>"), whose expiry alone counts as an attempt.
-- A claim of several quarantined messages is a group ("g<token>").

-- The due ids a claim of up to `batch` takes, in order, given their `scores` (the
-- seed layout's, else nil): quarantined ones are passed over, but for one group taken
-- first: up to the size each member allows, and a message allowed none but its own
-- claim only when `alone_ok`. Returns the ids, their scores, the group's ids as a set,
-- its kind ('q', 'g' or nil), and 1 if a quarantined message was passed over, else 0.
local function pass_quarantined(ids, scores, batch, alone_ok)
  local sizes = redis.call('HMGET', K_QUARANTINE, unpack(ids))
  local group, cap, others, passed, alone = {}, 0, {}, 0, false
  for i = 1, #ids do
    local size = tonumber(sizes[i])
    if not sizes[i] then
      others[#others + 1] = i
    elseif #group == 0 and (size > 1 or alone_ok) then
      group[1], cap, alone = i, math.min(size, batch), size == 1
    elseif #group + 1 <= math.min(cap, size) then
      group[#group + 1], cap = i, math.min(cap, size)
    else
      passed = 1
    end
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
  return kept, kept_scores, members, kind, passed
end

-- The size of claim a quarantined message of an expired claim that held `n` may next
-- be taken in: half, down to one.
local function quarantine_size(n)
  return math.max(1, math.floor(n / 2))
end
