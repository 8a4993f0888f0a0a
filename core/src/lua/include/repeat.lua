-- repeat.lua: occurrences of repeating messages.
-- @include order
-- @include schedule
-- @include forget
-- @include restamp
-- Repeating messages (see repeat_set.lua). Occurrence ids are "repeat:<name>:<due_ms>",
-- so an occurrence is found from its repeat's mark without an index.
local function occurrence_id(name, due)
  return 'repeat:' .. name .. ':' .. fmt(due)
end

-- Push the occurrence of `name` due at `due` (absolute ms) unless it exists, and mark
-- it as the repeat's latest. An expire_after deadline counts from `due`.
local function push_occurrence(name, due, envelope)
  local id = occurrence_id(name, due)
  if not redis.call('HGET', K_MSG, id) then
    local old_head = head_score()
    local score = score_at(due)
    if not SEED then
      envelope = stamped(envelope, fmt(score))
    end
    redis.call('HSET', K_MSG, id, with_deadline(envelope, due))
    redis.call('ZADD', K_SCHED, score, id)
    redis.call('HINCRBY', K_STATS, 'pushed', 1)
    wake_if_earlier(old_head, score)
  end
  redis.call('HSET', K_MARKS, name, fmt(due))
end

-- A repeat changed or went: its occurrence that still waits goes with it (one that
-- runs finishes).
local function cancel_pending_occurrence(name)
  local mark = redis.call('HGET', K_MARKS, name)
  if mark then
    local id = occurrence_id(name, tonumber(mark))
    if redis.call('ZREM', K_SCHED, id) == 1 then
      forget({id})
      redis.call('HINCRBY', K_STATS, 'cancelled', 1)
    end
    redis.call('HDEL', K_MARKS, name)
  end
end
