-- nack.lua: fail deliveries: retry later, or bury them in the dead-letter set.
-- ARGV[3] dead_max   ARGV[4] dead_ttl_ms
-- ARGV[5..] groups of 6: id, lease (as claim returned it), retry delay in ms (-1 = dead
--   letter now), error, stack trace ("" = none: an earlier attempt's is dropped),
--   options, words of: "keep_last_error" (the stored last error is added to the new
--   one), "unrun" (the handler never ran this delivery: no attempt is counted).
-- Returns one status per group: 1 retried, 2 buried, 0 lease lost, -1 gone, 3
--   cancelled: the message was marked cancelled while it ran (cancel.lua), so it is
--   deleted whatever the failure asked, and counted under "cancelled".
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include dead
-- @include forget
-- @include oom
-- @include order
-- @include schedule
-- @include serial
-- @include stall
-- @include restamp
-- KEYS: scheduled messages inflight leases attempts errors dead stats control traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
run_even_out_of_memory()
local now = queue_now(true)
absorb_stall(now)
local old_head = head_score()
local result = {}
local retried, buried, cancelled = 0, 0, 0
local traces_kept = redis.call('EXISTS', K_TRACE) == 1
local left, left_ids = {}, {}
for i = 5, #ARGV, 6 do
  local id, token, delay, err, trace = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4]
  local options = ARGV[i + 5]
  local keep_last_error = string.find(options, 'keep_last_error', 1, true) ~= nil
  local unrun = string.find(options, 'unrun', 1, true) ~= nil
  local held = redis.call('HGET', K_LEASE, id)
  local envelope = held and held == token and not SEED and redis.call('HGET', K_MSG, id)
  if envelope and cancel_mark(envelope) > 0 then
    free_serial_keys({id}, nil, nil, now)
    forget({id})
    cancelled = cancelled + 1
    result[#result + 1] = 3
    left[#left + 1] = token
    left_ids[#left_ids + 1] = id
  elseif held and held == token then
    local attempt = tonumber(redis.call('HGET', K_ATT, id) or '0')
    if not unrun then
      attempt = attempt + 1
    end
    if keep_last_error then
      local last = redis.call('HGET', K_ERR, id)
      if last then
        err = err .. '; the last error: ' .. last
      end
    end
    -- Its next state first (the dead letters or the schedule), then out of flight:
    -- no message is ever in neither.
    if delay < 0 then
      redis.call('ZADD', K_DEAD, now, id)
      buried = buried + 1
      result[#result + 1] = 2
    else
      local score = fmt(score_at(now + delay))
      if not SEED then
        -- Stamped with its new due time (see include/stamp.lua).
        if envelope then
          redis.call('HSET', K_MSG, id, stamped(envelope, score))
        end
      end
      redis.call('ZADD', K_SCHED, score, id)
      retried = retried + 1
      result[#result + 1] = 1
    end
    redis.call('HSET', K_ATT, id, attempt)
    redis.call('HSET', K_ERR, id, err)
    if trace ~= '' then
      redis.call('HSET', K_TRACE, id, trace)
      traces_kept = true
    elseif traces_kept then
      redis.call('HDEL', K_TRACE, id)
    end
    redis.call('HDEL', K_LEASE, id)
    left[#left + 1] = token
    left_ids[#left_ids + 1] = id
    free_serial_keys({id}, nil, nil, now)
  elseif redis.call('HEXISTS', K_MSG, id) == 1 then
    result[#result + 1] = 0
  else
    result[#result + 1] = -1
  end
end
leave_claims(left, #left, left_ids)
if retried > 0 then
  redis.call('HINCRBY', K_STATS, 'retried', retried)
  wake_if_new_head(old_head)
end
if cancelled > 0 then
  redis.call('HINCRBY', K_STATS, 'cancelled', cancelled)
end
if buried > 0 then
  redis.call('HINCRBY', K_STATS, 'dead', buried)
  trim_dead(now, tonumber(ARGV[3]), tonumber(ARGV[4]))
end
return result
