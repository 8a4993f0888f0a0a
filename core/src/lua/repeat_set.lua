-- repeat_set.lua: define or change a repeating message and push its first occurrence.
-- KEYS: see lib.lua.
-- ARGV[3] name   ARGV[4] definition (compared whole: the same text changes nothing)
-- ARGV[5] first due time (absolute ms)   ARGV[6] envelope of that occurrence
-- Returns the due time (ms) of the repeat's next occurrence: the one just pushed, or
-- for an unchanged definition the one already pending.
local name, definition = ARGV[3], ARGV[4]
if redis.call('HGET', K_REPEATS, name) == definition then
  local mark = redis.call('HGET', K_MARKS, name)
  if mark then
    return tonumber(mark)
  end
end
cancel_pending_occurrence(name)
redis.call('HSET', K_REPEATS, name, definition)
push_occurrence(name, tonumber(ARGV[5]), ARGV[6])
return tonumber(ARGV[5])
