-- push_one.lua: schedule one message of the native layout without replace, expiry or
-- serial key (push.lua takes the others); new unless a message of its id exists,
-- which it leaves as it is. ARGV[3] "delay" (ms from the queue clock) or "at" (Unix
-- time in ms), ARGV[4] the ms, ARGV[5] the id, ARGV[6] the envelope without its
-- opening brace, which the stamp writes (include/stamp.lua; claim number 0).
-- Returns {now_ms, created, 0}, as push.lua does.
-- Faults, without the preflight (include/guard.lua): every read and the wake-up come
-- before the first write, HSETNX, which a fault or a full Redis refuses whole; a later
-- write that fails undoes those before it. So a push either is written whole or
-- writes nothing.
-- @guarded
-- @include guard
-- @include clock
-- @include order
-- @include schedule
-- @include stamp
-- @adds
-- KEYS: messages scheduled stats control
local now, r, step = clock_at(redis.call('TIME'),
  redis.call('HMGET', K_CONTROL, 'clock_ms', 'step_ms', 'step_at', 'format'))
local old_head = head_score()
local due = tonumber(ARGV[4])
if ARGV[3] == 'delay' then
  due = now + due
end
local score = score_at(due)
local word = fmt(score)
local id = ARGV[5]
-- Before any write, so that a refused PUBLISH writes nothing; a push of an id that
-- exists wakes the pools for nothing.
wake_if_earlier(old_head, score)
if redis.call('HSETNX', K_MSG, id, STAMP_OPEN .. '0,' .. word .. '],' .. ARGV[6]) == 0 then
  return {now, 0, 0}
end
local reply = redis.pcall('ZADD', K_SCHED, word, id)
if not failed(reply) then
  reply = redis.pcall('HINCRBY', K_STATS, 'pushed', 1)
  if not failed(reply) then
    if clock_moved(r, step) then
      reply = redis.pcall('HSET', K_CONTROL, clock_fields(r, step))
    end
    if not failed(reply) then
      return {now, 1, 0}
    end
    redis.pcall('HINCRBY', K_STATS, 'pushed', -1)
    reply = fault(reply, 'HSET', K_CONTROL, true)
  else
    reply = fault(reply, 'HINCRBY', K_STATS, true)
  end
  redis.pcall('ZREM', K_SCHED, id)
else
  reply = fault(reply, 'ZADD', K_SCHED, true)
end
redis.pcall('HDEL', K_MSG, id)
return reply
