-- group_limit.lua: set or clear the limits of one group, or the default of every group
-- without limits of its own (include/group_limits.lua), on every pool and host.
-- ARGV[3] the group's key ("\1" and its name; "\1" alone for the default), ARGV[4] its
-- concurrency, ARGV[5] max and ARGV[6] per (ms) of its rate limit, each "" when not
-- set; all three "" clear the limits.
-- Returns 1 if limits were in force under that field before, 0 if not.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- @include group_gate
-- KEYS: scheduled inflight leases control serial_keys serial_holders serial_line serial_lined claims claim_ids group_grants
-- Messages held back by the limits before are woken here at most this many a call;
-- the rest when their safety net comes due (a lease, or the window).
local WOKEN = 1000
local key = ARGV[3]
local field = 'group' .. key
-- Stops where a newer build recorded a format this one cannot read.
queue_now(false)
local before = redis.call('HEXISTS', K_CONTROL, field)
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
if ARGV[4] == '' and ARGV[5] == '' then
  redis.call('HDEL', K_CONTROL, field)
else
  record_format(GROUPS_FORMAT)
  redis.call('HSET', K_CONTROL, field, ARGV[4] .. '|' .. ARGV[5] .. '|' .. ARGV[6])
end
-- Each line's first messages, as many as the limits now leave room for, go back to
-- the score they were due at.
local woken = 0
for _, group in ipairs(lines) do
  for _ = 1, math.min(group_room(group) or WOKEN, WOKEN - woken) do
    if not wake_line(group) then
      break
    end
    woken = woken + 1
  end
end
return before
