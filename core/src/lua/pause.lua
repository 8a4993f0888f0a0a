-- pause.lua: pause or resume consumption. While paused, claims hand out nothing
-- (pushes, cancels and the running handlers' completions go on as usual); on resume
-- the consumers sleeping until then are woken at once.
-- ARGV[3] "1" to pause, "0" to resume.
-- Returns 1 if the state changed, 0 if the queue already was in it.
-- The pause is a hash, not a string, so that the commands of the least-privilege ACL
-- rule (docs/RELIABILITY.md) cover it.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- @include schedule
-- KEYS: scheduled paused control
if ARGV[3] == '1' then
  if redis.call('EXISTS', K_PAUSED) == 1 then
    return 0
  end
  redis.call('HSET', K_PAUSED, 'since', fmt(queue_now(true)))
  return 1
end
local changed = redis.call('HDEL', K_PAUSED, 'since')
if changed == 1 then
  -- Consumers have slept since the pause as if the queue were empty: what is due
  -- now, or later, must wake them.
  wake_if_earlier(nil, head_score())
end
return changed
