-- restamp.lua: writing the stamp of include/stamp.lua.
-- @include stamp
-- `envelope` with its stamp set to score (its digits). An envelope
-- that is not a JSON object with a field (a hand edit, a foreign tool) comes back as
-- it is: its claim fails to decode it and buries it.
local function stamped(envelope, score_text)
  if string.byte(envelope, 1) ~= 123 then
    return envelope
  end
  local _, stamp_end = string.find(envelope, '^{"at":%[%-?%d+,%d+%],')
  local rest = string.sub(envelope, (stamp_end or 1) + 1)
  if rest == '}' then
    return envelope
  end
  return STAMP_OPEN .. '0,' .. score_text .. '],' .. rest
end
