-- cancel.lua: delete a message that is still waiting (scheduled or due, unclaimed).
-- KEYS: see lib.lua.   ARGV[3] id.
-- Returns 1 when it was removed, 0 when it is not waiting (unknown, running or dead).
local id = ARGV[3]
if redis.call('ZREM', K_SCHED, id) == 0 then
  return 0
end
forget({id})
redis.call('HINCRBY', K_STATS, 'cancelled', 1)
return 1
