-- repeat_set.lua: define or change a repeating message and push its first occurrence.
-- ARGV[3] name   ARGV[4] definition (compared whole: the same text changes nothing)
-- ARGV[5] first due time (absolute ms, after now)   ARGV[6] envelope of that occurrence
--   (an expire_after deadline in it is set from the due time)
-- Returns the due time (ms) of the repeat's next occurrence: the one pending for an
-- unchanged definition, else the one just pushed.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include repeat
-- @adds
-- KEYS: scheduled messages inflight leases attempts errors stats repeats repeat_marks traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local name, definition, first = ARGV[3], ARGV[4], tonumber(ARGV[5])
if redis.call('HGET', K_REPEATS, name) == definition then
  local mark = tonumber(redis.call('HGET', K_MARKS, name))
  if mark then
    local id = occurrence_id(name, mark)
    if redis.call('ZSCORE', K_SCHED, id) or redis.call('HGET', K_LEASE, id) or first <= mark then
      return mark
    end
  end
  -- Unchanged, but nothing waits or runs (purged, cancelled, or a pool failed to push
  -- the next one): the call mends the chain at once instead of leaving it to a claim.
  push_occurrence(name, first, ARGV[6])
  return first
end
cancel_pending_occurrence(name)
redis.call('HSET', K_REPEATS, name, definition)
push_occurrence(name, first, ARGV[6])
return first
