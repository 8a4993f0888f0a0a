-- dead_matching.lua: which dead letters have a last error that contains a text.
-- ARGV[3] first rank to look at (0: the oldest)   ARGV[4] how many to look at (at
--   most 1000, so one call never blocks Redis for long)   ARGV[5] the text (plain, not
--   a pattern)
-- Returns {the next rank to look at, or -1 once the set is done, then the ids that
--   match}. Read-only: the caller collects every match before it acts on them.
-- Faults: it writes nothing.
-- KEYS: errors dead
local first, count, text = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local ids = redis.call('ZRANGE', K_DEAD, first, first + count - 1)
local result = {#ids < count and -1 or first + #ids}
if #ids == 0 then
  return result
end
local errors = redis.call('HMGET', K_ERR, unpack(ids))
for i, id in ipairs(ids) do
  if errors[i] and string.find(errors[i], text, 1, true) then
    result[#result + 1] = id
  end
end
return result
