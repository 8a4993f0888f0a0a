-- group_limits.lua: a group's concurrency limit (include/serial.lua): control's field
-- "group" .. key, else "group\1" (the default for every group), else none (nil).
local function group_limit(key)
  local limits = redis.call('HMGET', K_CONTROL, 'group' .. key, 'group\1')
  return tonumber(limits[1] or limits[2])
end
