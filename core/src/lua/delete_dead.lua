-- delete_dead.lua: discard dead letters for good, envelope and all (someone has seen
-- them and decided that they must not run).
-- ARGV[3] id, or "" for the oldest ARGV[4] dead letters.
-- Returns the number deleted; the caller repeats "" calls until fewer than ARGV[4].
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include dead
-- @include forget
-- KEYS: scheduled messages inflight leases attempts errors dead stats traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local ids = chosen_dead()
if #ids == 0 then
  return 0
end
redis.call('ZREM', K_DEAD, unpack(ids))
forget(ids)
redis.call('HINCRBY', K_STATS, 'discarded', #ids)
return #ids
