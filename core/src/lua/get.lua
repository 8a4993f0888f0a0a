-- get.lua: everything known about one message.
-- ARGV[3] id.
-- Returns nil for an unknown id, else {state, envelope, due_ms, attempts, last_error,
--   dead_at_ms, lease_until_ms, completed_at_ms, error_trace, serial_key}; state is scheduled | ready | inflight
--   | dead | completed (kept after its acknowledgement, see keep_completed); due_ms is
--   -1 for a dead message; dead_at_ms is -1 unless dead; lease_until_ms is -1 unless
--   in flight; completed_at_ms is -1 unless completed; last_error is false when there
--   is none, and so is error_trace; serial_key is false for a message pushed without one.
--   A message in its serial key's line is ready, due when it was due (not when its
--   safety net would bring it back, see serial_gate).
-- Faults: it writes nothing.
-- @include claims
-- @include clock
-- @include stamp
-- KEYS: scheduled messages inflight leases attempts errors dead control completed completed_messages traces serial_keys serial_lined claims claim_ids
local id = ARGV[3]
local envelope = redis.call('HGET', K_MSG, id)
if not envelope then
  local record = redis.call('HGET', K_DONE_MSG, id)
  if not record then
    return nil
  end
  local attempts, due, kept = string.match(record, '^(%d+)|(-?%d+)|(.*)$')
  return {'completed', kept, tonumber(due), tonumber(attempts), false, -1, -1,
    tonumber(redis.call('ZSCORE', K_DONE, id)) or -1, false, false}
end
local serial = redis.call('HGET', K_SERIAL, id) or false
local attempts = tonumber(redis.call('HGET', K_ATT, id) or '0')
local err = redis.call('HGET', K_ERR, id)
local trace = redis.call('HGET', K_TRACE, id)
local score = redis.call('ZSCORE', K_SCHED, id)
if score then
  local lined = serial and redis.call('HGET', K_SERIAL_LINED, id)
  if lined then
    score = line_entry(lined, serial)
  end
  local due = due_of(tonumber(score))
  local state = 'scheduled'
  if tonumber(score) <= due_bound(queue_now(false)) then
    state = 'ready'
  end
  return {state, envelope, due, attempts, err, -1, -1, -1, trace, serial}
end
local lease = redis.call('HGET', K_LEASE, id)
if lease then
  local score = lease_score(lease) or stamp_score(envelope, queue_now(false))
  local lease_until = lease_deadline(id) or -1
  if not score then
    -- Nothing tells its due time: an envelope without a stamp (from a delayq before
    -- it) that its claim did not read, a lease of an older delayq, or a hand edit.
    return {'inflight', envelope, -1, attempts + 1, err, -1, lease_until, -1, trace, serial}
  end
  return {'inflight', envelope, due_of(score), attempts + 1, err, -1, lease_until, -1, trace, serial}
end
local died = redis.call('ZSCORE', K_DEAD, id)
if died then
  return {'dead', envelope, -1, attempts, err, tonumber(died), -1, -1, trace, serial}
end
return redis.error_reply('DQERR corrupt message ' .. id .. ' has an envelope but no state')
