-- order.lua: the schedule score of a message due at a millisecond. Messages due in
-- the same millisecond run in the order they were scheduled: each gets the next place
-- (the score's low bits) after the last one waiting at that millisecond, from 0. A
-- queue-wide counter in the low bits would wrap every 4096 pushes and put a later
-- push first. Past 4096 waiting in one millisecond the place stays at 4095 (Redis then
-- orders them by id). A script asks the schedule once for its highest score; only due
-- times at or below it are looked up, one range read each (once per millisecond per
-- script): a push due later than everything waiting, the common case, reads nothing more,
-- nor does the first one due at the millisecond of the highest score, the last there.
local order_last = {} -- per call
local order_tail = nil -- per call
local function score_at(due_ms)
  if SEED then
    -- Rounded up: a message may be late by the recipe's one-second grain, never early.
    return math.ceil(due_ms / 1000)
  end
  local base = due_ms * SEQ_SPAN
  local place = order_last[due_ms]
  if place == nil then
    -- Read in this call, the highest score is the schedule's now; read before, it may
    -- be passed by a score the script wrote without score_at (wake_line).
    local fresh = order_tail == nil
    if fresh then
      local tail = redis.call('ZRANGE', K_SCHED, -1, -1, 'WITHSCORES')
      -- An empty schedule has nothing at or above any due time.
      order_tail = tonumber(tail[2]) or -math.huge
    end
    place = -1
    if fresh and order_tail >= base and order_tail < base + SEQ_SPAN then
      -- The highest score is due at that millisecond: it is the last there (pushes a
      -- moment apart with one delay land here).
      place = order_tail - base
    elseif base <= order_tail then
      -- The last of that millisecond.
      local last = redis.call('ZREVRANGEBYSCORE', K_SCHED, fmt(base + SEQ_SPAN - 1), fmt(base), 'WITHSCORES', 'LIMIT', 0, 1)
      if last[2] then
        place = tonumber(last[2]) - base
      end
    end
  end
  place = math.min(place + 1, SEQ_SPAN - 1)
  order_last[due_ms] = place
  return base + place
end
