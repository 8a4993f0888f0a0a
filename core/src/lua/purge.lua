-- purge.lua: delete every message of the queue in any state; counters, a pause, a rate
-- limit (with its window: what was handed out still counts) and repeat definitions are
-- kept (a repeat whose occurrence went gets its next one from the next claim that
-- looks, see claim.lua). Groups keep their limits; their rate windows start afresh
-- (what ran of them is gone).
-- Kept completed messages go too, uncounted (they are no longer messages of the queue).
-- Returns the number of messages deleted.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- KEYS: scheduled messages inflight leases attempts errors dead stats completed completed_messages traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine group_grants
local count = redis.call('HLEN', K_MSG)
redis.call('UNLINK', K_SCHED, K_MSG, K_INFLIGHT, K_LEASE, K_ATT, K_ERR, K_DEAD, K_DONE, K_DONE_MSG, K_TRACE,
  K_SERIAL, K_SERIAL_HOLD, K_SERIAL_LINE, K_SERIAL_LINED, K_CLAIMS, K_CLAIM_IDS, K_QUARANTINE, K_GROUP_GRANTS)
redis.call('HINCRBY', K_STATS, 'purged', count)
return count
