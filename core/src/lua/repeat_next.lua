-- repeat_next.lua: push the next occurrence of a repeating message, once.
-- ARGV[3] name   ARGV[4] the definition it was computed from   ARGV[5] due time
--   (absolute ms)   ARGV[6] envelope
-- Returns 1 if pushed; 0 if the definition changed or went meanwhile, or an occurrence
-- at or after that time was pushed already (by another pool, or an earlier call).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include repeat
-- @adds
-- KEYS: scheduled messages inflight leases attempts errors stats repeats repeat_marks traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local name = ARGV[3]
if redis.call('HGET', K_REPEATS, name) ~= ARGV[4] then
  return 0
end
local due = tonumber(ARGV[5])
if due <= (tonumber(redis.call('HGET', K_MARKS, name)) or 0) then
  return 0
end
push_occurrence(name, due, ARGV[6])
return 1
