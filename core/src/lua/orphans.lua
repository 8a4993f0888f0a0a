-- orphans.lua: end deliveries that hold no message: a claim handed out an id whose
-- envelope its caller then found missing (scheduled by hand or by a foreign tool
-- without one: claim.lua reads the envelopes only where serial keys need them).
-- ARGV[3..] pairs: id, lease (as claim returned it).
-- Returns the number of ids dropped. A pair whose lease was lost is left as it is, and
-- so is an id named again; one whose id was pushed in the meantime (an envelope, and
-- in the schedule) only ends its delivery; one that has an envelope and no other
-- state (a hand edit) keeps its lease, which expires: the reaper then schedules the
-- message and counts the delivery as an attempt. The rate limit's window keeps
-- counting what the claim granted them, which errs on the side of the limit.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include forget
-- @include oom
-- @include serial
-- KEYS: scheduled messages inflight leases attempts errors stats traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
if #ARGV % 2 ~= 0 then
  return redis.error_reply('DQERR orphans takes (id, lease) pairs: the last is cut short')
end
run_even_out_of_memory()
local ids, leases, pushed, pushed_leases, seen = {}, {}, {}, {}, {}
for i = 3, #ARGV, 2 do
  local id, lease = ARGV[i], ARGV[i + 1]
  -- The loop only reads: an id named twice would leave its claim twice.
  local first = not seen[id]
  seen[id] = true
  if first and redis.call('HGET', K_LEASE, id) == lease then
    if redis.call('HEXISTS', K_MSG, id) == 0 then
      ids[#ids + 1] = id
      leases[#ids] = lease
    elseif redis.call('ZSCORE', K_SCHED, id) then
      pushed[#pushed + 1] = id
      pushed_leases[#pushed] = lease
    end
  end
end
if #ids > 0 then
  free_serial_keys(ids)
  forget(ids)
  leave_claims(leases, #ids, ids)
end
if #pushed > 0 then
  redis.call('HDEL', K_LEASE, unpack(pushed))
  leave_claims(pushed_leases, #pushed, pushed)
end
local ended = #ids + #pushed
if ended > 0 then
  -- Their claim counted them delivered.
  redis.call('HINCRBY', K_STATS, 'delivered', -ended)
end
if #ids > 0 then
  redis.call('HINCRBY', K_STATS, 'orphaned', #ids)
end
return #ids
