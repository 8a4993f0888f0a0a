-- minutes.lua: the partition's per-minute records (see minutes_add.lua).
-- Returns {now_ms, minute1, record1, minute2, record2, ...} in no order.
-- Faults: it writes nothing.
-- @include clock
-- KEYS: minutes control
local result = {queue_now(false)}
for _, v in ipairs(redis.call('HGETALL', K_MINUTES)) do
  result[#result + 1] = v
end
return result
