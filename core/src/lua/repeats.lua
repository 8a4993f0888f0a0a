-- repeats.lua: the repeating messages of this partition.
-- ARGV[3] a name, or "" for all.
-- Returns groups of 3: name, definition, due time (ms) of the latest occurrence pushed
--   (-1 if none).
-- Faults: it writes nothing.
-- KEYS: repeats repeat_marks
local result = {}
local function add(name, definition)
  result[#result + 1] = name
  result[#result + 1] = definition
  result[#result + 1] = tonumber(redis.call('HGET', K_MARKS, name)) or -1
end
if ARGV[3] ~= '' then
  local definition = redis.call('HGET', K_REPEATS, ARGV[3])
  if definition then
    add(ARGV[3], definition)
  end
  return result
end
local all = redis.call('HGETALL', K_REPEATS)
for i = 1, #all, 2 do
  add(all[i], all[i + 1])
end
return result
