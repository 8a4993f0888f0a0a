-- repeat_del.lua: stop a repeating message; its occurrence that still waits is
-- cancelled (one that runs finishes).
-- ARGV[3] name.
-- Returns 1 if it existed, 0 if not.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include repeat
-- KEYS: scheduled messages inflight leases attempts errors stats repeats repeat_marks traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local name = ARGV[3]
if redis.call('HDEL', K_REPEATS, name) == 0 then
  return 0
end
cancel_pending_occurrence(name)
return 1
