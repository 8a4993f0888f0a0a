-- group_limit.lua: set or clear the concurrency limit of one group, or the default of
-- every group (include/serial.lua): at most that many of a group's messages run at
-- once, on every pool and host.
-- ARGV[3] the group's key ("\1" and its name; "\1" alone for the default), ARGV[4] the
-- limit (1 or more), "" to clear it.
-- Returns the limit in force before under that field, -1 if none.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include group_limits
-- @include serial
-- KEYS: scheduled inflight leases control serial_keys serial_holders serial_line serial_lined claims claim_ids
-- Groups held back by a lower limit are woken here at most this many a call; the rest
-- when their safety net comes due (a lease).
local WOKEN = 1000
local key, limit = ARGV[3], ARGV[4]
local field = 'group' .. key
local before = tonumber(redis.call('HGET', K_CONTROL, field)) or -1
-- The lines to look at: the group's own, or every group's (their keys sort before any
-- serial key's), a group at a time.
local lines = {}
if key ~= '\1' then
  lines[1] = key
else
  local from = '[\1'
  while #lines < WOKEN do
    local first = redis.call('ZRANGEBYLEX', K_SERIAL_LINE, from, '(\2', 'LIMIT', 0, 1)[1]
    if not first then
      break
    end
    local group = string.match(first, '^([^%z]*)')
    lines[#lines + 1] = group
    from = '(' .. group .. '\1'
  end
end
if limit == '' then
  redis.call('HDEL', K_CONTROL, field)
else
  redis.call('HSET', K_CONTROL, field, limit)
end
-- Each line's first messages, as many as the limit now leaves room for, go back to
-- the score they were due at.
local woken = 0
for _, group in ipairs(lines) do
  local now_limit = group_limit(group)
  local running = tonumber(redis.call('HGET', K_SERIAL_HOLD, group)) or 0
  local room = now_limit and now_limit - running or WOKEN
  for _ = 1, math.min(room, WOKEN - woken) do
    if not wake_line(group) then
      break
    end
    woken = woken + 1
  end
end
return before
