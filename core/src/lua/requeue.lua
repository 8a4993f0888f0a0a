-- requeue.lua: send dead letters back to the queue, due now, with a fresh attempt
-- budget (the last error stays visible until the next attempt ends) and, for an
-- expiring message, a fresh deadline (it may have died of the old one).
-- ARGV[3] id, or "" for the oldest ARGV[4] dead letters.
-- Returns the number requeued; the caller repeats "" calls until fewer than ARGV[4].
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- @include dead
-- @include order
-- @include schedule
-- @include restamp
-- KEYS: scheduled messages inflight leases attempts errors dead stats control traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
local ids = chosen_dead()
if #ids == 0 then
  return 0
end
local old_head = head_score()
local now = queue_now(true)
local adds = {}
for i, id in ipairs(ids) do
  adds[#adds + 1] = fmt(score_at(now))
  adds[#adds + 1] = id
end
if not SEED then
  local envelopes = redis.call('HMGET', K_MSG, unpack(ids))
  local renewed = {}
  for i, id in ipairs(ids) do
    local envelope = envelopes[i]
    if envelope then
      renewed[#renewed + 1] = id
      renewed[#renewed + 1] = stamped(with_deadline(envelope, now), adds[2 * i - 1])
    end
  end
  if #renewed > 0 then
    redis.call('HSET', K_MSG, unpack(renewed))
  end
end
redis.call('ZREM', K_DEAD, unpack(ids))
redis.call('HDEL', K_ATT, unpack(ids))
redis.call('ZADD', K_SCHED, unpack(adds))
redis.call('HINCRBY', K_STATS, 'requeued', #ids)
wake_if_new_head(old_head)
return #ids
