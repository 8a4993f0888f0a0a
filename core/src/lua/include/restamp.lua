-- restamp.lua: writing the stamp of include/stamp.lua.
-- @include stamp
-- The queue's sequence now, as a stamp's claim number. INCRBY by 0, not GET: ACL
-- rules that an older delayq wrote grant INCRBY on the sequence and no GET.
local function claim_number()
  return fmt(redis.call('INCRBY', K_SEQ, 0))
end

-- `envelope` with its stamp set to claim_no and score (both as digits). An envelope
-- that is not a JSON object with a field (a hand edit, a foreign tool) comes back as
-- it is: its claim fails to decode it and buries it.
local function stamped(envelope, claim_no, score_text)
  if string.byte(envelope, 1) ~= 123 then
    return envelope
  end
  local _, stamp_end = string.find(envelope, '^{"at":%[%d+,%d+%],')
  local rest = string.sub(envelope, (stamp_end or 1) + 1)
  if rest == '}' then
    return envelope
  end
  return STAMP_OPEN .. claim_no .. ',' .. score_text .. '],' .. rest
end
