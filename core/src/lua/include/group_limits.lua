-- group_limits.lua: the limits of groups (include/serial.lua): at most `concurrency`
-- of a group's messages run at once, and at most `max` start in any window of `per`
-- ms. A group's limits are control's field "group" .. key, else "group\1" (the
-- default for every group), as "<concurrency>|<max>|<per>" (each part empty when
-- not set). The starts of a group still in its window are counted in its holders
-- entry "\2" .. name, and each claim's grant is logged (group_grants) until it leaves
-- the window, as the queue's own rate limit does (limit.lua; include/group_gate.lua).

-- concurrency, max, per of `key` (nil each when not set).
local function group_limit(key)
  local limits = redis.call('HMGET', K_CONTROL, 'group' .. key, 'group\1')
  local text = limits[1] or limits[2]
  if not text then
    return nil, nil, nil
  end
  local concurrency, max, per = string.match(text, '^(%d*)|(%d*)|(%d*)$')
  return tonumber(concurrency), tonumber(max), tonumber(per)
end

local function rate_field(key)
  return '\2' .. string.sub(key, 2)
end

-- Why a message in `key`'s line waits (get.lua, list.lua): {"serial", holder id or
-- false}, {"concurrency", running, limit}, {"rate", starts in the window, max, per
-- ms}, or {"line"} (a place freed: it is due again).
local function why_held(key)
  if string.byte(key, 1) ~= 1 then
    return {'serial', redis.call('HGET', K_SERIAL_HOLD, key) or false}
  end
  local concurrency, max, per = group_limit(key)
  local counts = redis.call('HMGET', K_SERIAL_HOLD, key, rate_field(key))
  local running, used = tonumber(counts[1]) or 0, tonumber(counts[2]) or 0
  if concurrency and running >= concurrency then
    return {'concurrency', running, concurrency}
  elseif max and used >= max then
    return {'rate', used, max, per}
  end
  return {'line'}
end
