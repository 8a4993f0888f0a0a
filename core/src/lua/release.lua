-- release.lua: give back deliveries that a stopping worker prefetched but never
-- started: due again at once, at their old place, and the attempt does not count.
-- ARGV[3..] pairs: id, lease (as claim returned it).
-- Returns {released, cancelled}: how many went back, and how many were deleted instead
--   as marked cancelled meanwhile (cancel.lua), counted under "cancelled"; pairs whose
--   lease was lost are skipped.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include forget
-- @include oom
-- @include schedule
-- @include serial
-- @include stall
-- @include restamp
-- KEYS: scheduled messages inflight leases attempts errors traces stats control serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
run_even_out_of_memory()
local now = queue_now(true)
absorb_stall(now)
local old_head = head_score()
local released, left, left_ids, cancelled = 0, {}, {}, 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local lease = redis.call('HGET', K_LEASE, id)
  local envelope = lease and lease == token and not SEED and redis.call('HGET', K_MSG, id)
  if envelope and cancel_mark(envelope) > 0 then
    free_serial_keys({id}, nil, nil, now)
    forget({id})
    cancelled = cancelled + 1
    left[released + cancelled] = lease
    left_ids[released + cancelled] = id
  elseif lease and lease == token then
    -- Back to the score it was claimed at: its place in line is kept, and the
    -- delivery never ran, so it does not count as an attempt.
    local stamp = envelope and stamp_score(envelope, now)
    -- Neither the lease nor the stamp tells its place (a hand edit): due now.
    local score = lease_score(lease) or stamp or score_at(now)
    -- Stamped again: the message leaves this claim (see include/stamp.lua). An
    -- envelope without a stamp that parses (a hand edit) stays as it is.
    if stamp then
      redis.call('HSET', K_MSG, id, stamped(envelope, fmt(score)))
    end
    redis.call('ZADD', K_SCHED, score, id)
    redis.call('HDEL', K_LEASE, id)
    -- Claimed from the quarantine (see claim.lua), and never started: back in it, in
    -- a claim no larger than the one it leaves.
    local kind = string.sub(lease, 1, 1)
    if kind == 'q' or kind == 'g' then
      local held = tonumber(redis.call('HGET', K_CLAIM_IDS, claim_token(lease) .. '#')) or 1
      redis.call('HSET', K_QUARANTINE, id, kind == 'q' and 1 or math.max(held, 2))
    end
    free_serial_keys({id}, nil, nil, now)
    released = released + 1
    left[released + cancelled] = lease
    left_ids[released + cancelled] = id
  end
end
leave_claims(left, released + cancelled, left_ids)
if cancelled > 0 then
  redis.call('HINCRBY', K_STATS, 'cancelled', cancelled)
end
if released > 0 then
  redis.call('HINCRBY', K_STATS, 'released', released)
  wake_if_new_head(old_head)
end
return {released, cancelled}
