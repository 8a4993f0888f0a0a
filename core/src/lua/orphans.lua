-- orphans.lua: end deliveries that hold no message: a claim handed out an id whose
-- envelope its caller then found missing (scheduled by hand or by a foreign tool
-- without one: claim.lua reads the envelopes only where serial keys need them).
-- ARGV[3..] pairs: id, lease (as claim returned it).
-- Returns the number ended. A pair whose lease was lost, or whose id has an envelope
-- after all, is left as it is: its lease expires and the reaper delivers it again.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include forget
-- @include oom
-- @include serial
-- KEYS: scheduled messages inflight leases attempts errors stats traces serial_keys serial_holders serial_line serial_lined claims claim_ids
if #ARGV % 2 ~= 0 then
  return redis.error_reply('DQERR orphans takes (id, lease) pairs: the last is cut short')
end
run_even_out_of_memory()
local ids, leases = {}, {}
for i = 3, #ARGV, 2 do
  local id, lease = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', K_LEASE, id) == lease and redis.call('HEXISTS', K_MSG, id) == 0 then
    ids[#ids + 1] = id
    leases[#ids] = lease
  end
end
if #ids > 0 then
  free_serial_keys(ids)
  forget(ids)
  leave_claims(leases, #ids, ids)
  -- Their claim counted them delivered.
  redis.call('HINCRBY', K_STATS, 'delivered', -#ids)
  redis.call('HINCRBY', K_STATS, 'orphaned', #ids)
end
return #ids
