-- schedule.lua: the schedule's head, and the wake-up that idle consumers sleep on.
local function head_score()
  local head = redis.call('ZRANGE', K_SCHED, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end

-- Idle consumers sleep until the earliest due time on a client-side timer; a
-- message that becomes the new head must wake them, so its due time is published.
local function wake_if_earlier(old_head, lowest_added)
  if lowest_added and (old_head == nil or lowest_added < old_head) then
    redis.call('PUBLISH', CHANNEL, fmt(due_of(lowest_added)))
  end
end

local function wake_if_new_head(old_head)
  wake_if_earlier(old_head, head_score())
end
