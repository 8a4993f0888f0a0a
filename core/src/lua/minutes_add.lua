-- minutes_add.lua: a consumer pool adds what its handlers did since its last call to
-- the partition's per-minute records (see include/minutes.lua), when no claim carried
-- them.
-- ARGV[3] minutes kept   ARGV[4..] one delta each: "<minute> <handled> <failed>[ <bucket>:<count>...]"
-- Returns the current minute (queue clock ms / 60000).
-- Faults: every delta is read before the first write; a malformed one is a caller bug.
-- @include clock
-- @include minutes
-- @adds
-- KEYS: scheduled leases control minutes
local keep = tonumber(ARGV[3])
if not keep or keep < 1 then
  return redis.error_reply('DQERR minutes kept must be at least 1, got ' .. tostring(ARGV[3]))
end
local deltas, malformed = read_minute_deltas(ARGV, 4, #ARGV)
if not deltas then
  return redis.error_reply('DQERR ' .. malformed)
end
return add_minutes(queue_now(false), keep, deltas)
