-- get.lua: everything known about one message.
-- ARGV[3] id   ARGV[4] largest envelope sent whole, in bytes   ARGV[5] largest error
--   text and ARGV[6] largest trace sent whole (longer ones are cut, see
--   include/shown.lua): `find` lists what it found with the listings' bounds.
-- Returns nil for an unknown id, else {state, envelope (or its size in bytes, a number,
--   when it is larger than ARGV[4]: it is not read), due_ms, attempts, last_error,
--   dead_at_ms, lease_until_ms, completed_at_ms, error_trace, serial_key}; state is scheduled | ready | inflight
--   | dead | completed (kept after its acknowledgement, see keep_completed); due_ms is
--   -1 for a dead message; dead_at_ms is -1 unless dead; lease_until_ms is -1 unless
--   in flight; completed_at_ms is -1 unless completed; last_error is false when there
--   is none, and so is error_trace; serial_key is false for a message pushed without one.
--   A message in its serial key's line is ready, due when it was due (not when its
--   safety net would bring it back, see serial_gate).
--   A waiting message in its key's or group's line also comes with why it waits:
--   {"serial", holder id or false}, {"concurrency", running, limit}, {"rate", starts
--   in the window, max, per ms}, or {"line"} (a place freed: it is due again).
-- Faults: it writes nothing.
-- @include claims
-- @include group_limits
-- @include clock
-- @include shown
-- @include stamp
-- KEYS: scheduled messages inflight leases attempts errors dead control completed completed_messages traces serial_keys serial_holders serial_lined claims claim_ids
local id = ARGV[3]
local max_envelope, max_error, max_trace = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local envelope = sized_values(K_MSG, {id}, max_envelope)[1]
if not envelope then
  local record = sized_values(K_DONE_MSG, {id}, max_envelope)[1]
  if not record then
    return nil
  end
  local attempts, due, kept
  if type(record) == 'number' then
    -- Its attempts and due time lead the record: read it for them, send its size.
    attempts, due = string.match(redis.call('HGET', K_DONE_MSG, id), '^(%d+)|(-?%d+)|')
    kept = record
  else
    attempts, due, kept = string.match(record, '^(%d+)|(-?%d+)|(.*)$')
  end
  return {'completed', kept, tonumber(due), tonumber(attempts), false, -1, -1,
    tonumber(redis.call('ZSCORE', K_DONE, id)) or -1, false, false}
end
-- A left-out envelope's stamp is not read (stamp_score then gives nothing).
local stored = type(envelope) == 'string' and envelope or nil
local serial = redis.call('HGET', K_SERIAL, id) or false
local attempts = tonumber(redis.call('HGET', K_ATT, id) or '0')
local err = cut_text(redis.call('HGET', K_ERR, id), max_error)
local trace = cut_text(redis.call('HGET', K_TRACE, id), max_trace)
local score = redis.call('ZSCORE', K_SCHED, id)
if score then
  local lined = serial and redis.call('HGET', K_SERIAL_LINED, id)
  local held = false
  if lined then
    score = line_entry(lined, serial)
    held = why_held(serial)
  elseif serial and string.byte(serial, 1) == 1 and stored then
    -- Woken from its group's line behind what was due then: its stamp tells when it
    -- was due.
    score = stamp_score(stored, queue_now(false)) or score
  end
  local due = due_of(tonumber(score))
  local state = 'scheduled'
  if tonumber(score) <= due_bound(queue_now(false)) then
    state = 'ready'
  end
  return {state, envelope, due, attempts, err, -1, -1, -1, trace, serial, held}
end
local lease = redis.call('HGET', K_LEASE, id)
if lease then
  local score = lease_score(lease) or stamp_score(stored, queue_now(false))
  local lease_until = lease_deadline(id) or -1
  if not score then
    -- Nothing tells its due time: its envelope was left out, or a hand edit.
    return {'inflight', envelope, -1, attempts + 1, err, -1, lease_until, -1, trace, serial}
  end
  return {'inflight', envelope, due_of(score), attempts + 1, err, -1, lease_until, -1, trace, serial}
end
local died = redis.call('ZSCORE', K_DEAD, id)
if died then
  return {'dead', envelope, -1, attempts, err, tonumber(died), -1, -1, trace, serial}
end
return redis.error_reply('DQERR corrupt message ' .. id .. ' has an envelope but no state')
