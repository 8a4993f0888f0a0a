-- delete_dead.lua: discard dead letters for good, envelope and all (someone has seen
-- them and decided that they must not run).
-- KEYS: see lib.lua.
-- ARGV[3] id, or "" for the oldest ARGV[4] dead letters.
-- Returns the number deleted; the caller repeats "" calls until fewer than ARGV[4].
local ids = chosen_dead()
if #ids == 0 then
  return 0
end
redis.call('ZREM', K_DEAD, unpack(ids))
forget(ids)
redis.call('HINCRBY', K_STATS, 'discarded', #ids)
return #ids
