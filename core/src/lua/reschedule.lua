-- reschedule.lua: move a waiting message to a new due time (an expiring message's
-- deadline moves with it).
-- ARGV[3] id   ARGV[4] "delay" (from the server clock) or "at" (Unix time)   ARGV[5] ms
-- Returns the new due time in ms, or -1 when the message is not waiting.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- @include order
-- @include schedule
-- @include serial
-- @include restamp
-- KEYS: scheduled messages inflight leases control serial_keys serial_holders serial_line serial_lined claims claim_ids
local id, kind, ms = ARGV[3], ARGV[4], tonumber(ARGV[5])
if not redis.call('ZSCORE', K_SCHED, id) then
  return -1
end
local old_head = head_score()
local due = ms
if kind == 'delay' then
  due = queue_now(true) + ms
end
local score = score_at(due)
if not SEED then
  local envelope = redis.call('HGET', K_MSG, id)
  if envelope then
    redis.call('HSET', K_MSG, id, stamped(with_deadline(envelope, due), fmt(score)))
  end
end
redis.call('ZADD', K_SCHED, score, id)
-- Its new due time stands: no holder's end may move it back to its old place in line.
unline({id})
wake_if_new_head(old_head)
return due_of(score)
