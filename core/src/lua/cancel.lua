-- cancel.lua: delete messages that still wait (scheduled or due, unclaimed).
-- ARGV[3] the counter that counts them: "cancelled", or "moved" when move_waiting
--   took them to another queue.   ARGV[4..] ids.
-- Returns the ids deleted; the others do not wait here (unknown, running or dead).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include forget
-- KEYS: scheduled messages inflight leases attempts errors stats traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local removed = {}
for i = 4, #ARGV do
  if redis.call('ZREM', K_SCHED, ARGV[i]) == 1 then
    removed[#removed + 1] = ARGV[i]
  end
end
forget(removed)
if #removed > 0 then
  redis.call('HINCRBY', K_STATS, ARGV[3], #removed)
end
return removed
