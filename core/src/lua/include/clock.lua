-- clock.lua: the queue's clock: Redis's clock, made never to run backward. Read as
-- is, a step back of Redis's clock by S (an NTP step, a failover to a replica whose
-- clock is behind) would hold every message that was due before it for S, and let
-- messages pushed after it run first. So every script reads time through queue_now():
-- Redis time plus an offset kept in :control:
--   clock_ms  the latest Redis time a writing script saw;
--   step_ms, step_at  the offset learned at the last step back, and the Redis time
--             it was learned at.
-- Redis time below clock_ms is a step back: the offset grows by its size, so queue
-- time goes on from where it stood, and is then phased out at PHASE_OUT of the time
-- that passes (the queue clock runs at 1 - PHASE_OUT of Redis's speed until they
-- meet, S / PHASE_OUT later): a delay in that time takes up to 1 / (1 - PHASE_OUT) of
-- itself, and a message pushed for an absolute time can run up to the remaining
-- offset early. When the step came between clock_ms and now cannot be told (Redis
-- gives scripts no other clock), so queue time stands still over all of it rather
-- than run anything early: messages waiting at the step run that much later.
-- A step forward is not undone (a queue clock behind a clock that was set right
-- would stay wrong): messages due within it run early, and include/stall.lua keeps
-- it from expiring live leases.
local PHASE_OUT = 0.1

-- The offset still in force at Redis time `r`.
local function offset_at(step, step_at, r)
  if not step or step <= 0 then
    return 0
  end
  return math.max(0, step - math.floor((r - step_at) * PHASE_OUT))
end

-- The microseconds past the millisecond of the last queue_now(), from Redis's TIME
-- (the offset is whole milliseconds): a pool that sleeps until a due time maps it onto
-- its own clock, and the whole millisecond alone would make it wake up to 1 ms late.
-- While an offset phases out, the queue clock can repeat a millisecond, so a reading
-- may step back by less than 1 ms: the pool then wakes that much later, not earlier.
local queue_now_us = 0 -- per call

-- The stored format of the queue's keys and values (docs/workers.md, "Upgrading"),
-- kept in :control beside the clock: recorded by the first script that stores the
-- clock, and read by every script that reads it, which stops before its first write
-- where a newer delayq recorded a higher one ("DQERR format <stored> <this build's>").
-- FORMAT is the highest this build reads; a queue records FIRST_FORMAT until it holds
-- groups, which builds before them would take for serial keys: then GROUPS_FORMAT.
local FORMAT = '2'
local FIRST_FORMAT = '1'
local GROUPS_FORMAT = '2'
local format_stored = nil -- per call, as clock_at read it
local format_unrecorded = false -- per call
-- clock_ms as clock_at read it.
local clock_last = nil -- per call

-- The queue time at Redis time `t` (TIME's reply), with `c` the fields clock_ms,
-- step_ms, step_at and format of :control; then Redis time in ms and, after a step
-- back, the offset to store (clock_fields).
local function clock_at(t, c)
  local stored = tonumber(c[4])
  if stored and stored > tonumber(FORMAT) then
    raise(redis.error_reply('DQERR format ' .. fmt(stored) .. ' ' .. FORMAT))
  end
  format_stored, format_unrecorded = stored, stored == nil
  clock_last = tonumber(c[1])
  local r = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  queue_now_us = tonumber(t[2]) % 1000
  local last, step, step_at = clock_last, tonumber(c[2]), tonumber(c[3])
  if last and r < last then
    step = offset_at(step, step_at, last) + (last - r)
    return r + step, r, step
  end
  return r + offset_at(step, step_at, r), r, nil
end

-- Whether a writing script has something to store of clock_at's reading: not when
-- the clock stands where it was stored (scripts within one millisecond).
local function clock_moved(r, step)
  return r ~= clock_last or step ~= nil or format_unrecorded
end

-- The fields of :control a writing script stores of clock_at's reading.
local function clock_fields(r, step)
  if step and format_unrecorded then
    return 'clock_ms', fmt(r), 'step_ms', fmt(step), 'step_at', fmt(r), 'format', FIRST_FORMAT
  end
  if step then
    return 'clock_ms', fmt(r), 'step_ms', fmt(step), 'step_at', fmt(r)
  end
  if format_unrecorded then
    return 'clock_ms', fmt(r), 'format', FIRST_FORMAT
  end
  return 'clock_ms', fmt(r)
end

-- `learn`: whether this script may write what it finds; scripts that only read tell
-- the time a write would have given.
local function queue_now(learn)
  local now, r, step = clock_at(redis.call('TIME'),
    redis.call('HMGET', K_CONTROL, 'clock_ms', 'step_ms', 'step_at', 'format'))
  if learn and clock_moved(r, step) then
    redis.call('HSET', K_CONTROL, clock_fields(r, step))
  end
  return now
end

-- Record that the queue holds what only format `n` and later read, after queue_now
-- read the format (a build that reads less then stops on the queue).
local function record_format(n)
  if (format_stored or 0) < tonumber(n) then
    redis.call('HSET', K_CONTROL, 'format', n)
    format_stored = tonumber(n)
  end
end
