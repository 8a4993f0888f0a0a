-- cancel.lua: delete messages that still wait (scheduled or due, unclaimed), and
-- mark cancelled those that run.
-- ARGV[3] the counter that counts the deleted: "cancelled", or "moved" when
--   move_waiting took them to another queue.   ARGV[4] the mark for those that run:
--   "" leaves them alone, "1" cancelled, "2" cancelled and the process that runs it
--   to be killed (see include/stamp.lua).   ARGV[5..] ids.
-- Returns the ids deleted or marked; the others are unknown or dead, or run where no
--   mark can be stored: in the seed layout, or with an envelope without a stamp.
-- A marked delivery ends as cancelled whatever its handler does, counted under
-- "cancelled" then (ack.lua, nack.lua, release.lua and claim.lua's reaper): it never
-- runs again. Its pool learns of the mark at its next heartbeat (extend.lua), and
-- until then its ack finds it (ack.lua): both look for marks while control's
-- cancel_ms is recent, which is the latest end, as the mark found them, of the leases
-- of marked messages (each pool's heartbeat comes before its lease ends, whatever
-- the lease of the pool that ran a script last).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include claims
-- @include clock
-- @include forget
-- @include stamp
-- KEYS: scheduled messages inflight leases attempts errors stats traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine control
local mark = ARGV[4]
-- Every read before the first write: a queue of a newer format stops it with nothing
-- written (queue_now), and no read can fail past a write.
local now = mark ~= '' and queue_now(true)
local latest = now and tonumber(redis.call('HGET', K_CONTROL, 'cancel_ms'))
local removed, marked, envelopes, lease_end, seen = {}, {}, {}, now, {}
for i = 5, #ARGV do
  local id = ARGV[i]
  if seen[id] then
    -- Named twice: once is its answer.
  elseif redis.call('ZSCORE', K_SCHED, id) then
    removed[#removed + 1] = id
  elseif mark ~= '' and not SEED and redis.call('HEXISTS', K_LEASE, id) == 1 then
    local envelope = redis.call('HGET', K_MSG, id)
    local now_marked = envelope and cancel_mark(envelope)
    -- Marked already: a kill asked for stays asked for.
    local changed = envelope and cancel_marked(envelope, math.max(now_marked, tonumber(mark)))
    if changed then
      lease_end = math.max(lease_end, lease_deadline(id) or now)
      marked[#marked + 1] = id
      envelopes[#envelopes + 1] = id
      envelopes[#envelopes + 1] = changed
    end
  end
  seen[id] = true
end
if #removed > 0 then
  redis.call('ZREM', K_SCHED, unpack(removed))
  forget(removed)
  redis.call('HINCRBY', K_STATS, ARGV[3], #removed)
end
if #marked > 0 then
  redis.call('HSET', K_MSG, unpack(envelopes))
  redis.call('HSET', K_CONTROL, 'cancel_ms', fmt(math.max(lease_end, latest or lease_end)))
  for _, id in ipairs(marked) do
    removed[#removed + 1] = id
  end
end
return removed
