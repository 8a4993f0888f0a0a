-- group_gate.lua: what claims and limit changes do with groups' limits
-- (include/group_limits.lua): a claim's gate of group messages, the grants that leave
-- their window, the room a group has.
-- @include group_limits
-- @include serial

-- Grants that left their window: their starts no longer count, and as many of the
-- group's line go back to the schedule (at most 1000 grants a call: the next claim
-- takes the rest, which only errs on the side of the limit).
local function expire_group_grants(now)
  if redis.call('EXISTS', K_GROUP_GRANTS) == 0 then
    return
  end
  local old = redis.call('ZRANGEBYSCORE', K_GROUP_GRANTS, '-inf', now, 'LIMIT', 0, 1000)
  if #old == 0 then
    return
  end
  local order, freed = {}, {}
  for _, grant in ipairs(old) do
    local key, count = string.match(grant, '^([^%z]*)%z[^%z]*%z(%d+)$')
    if not freed[key] then
      order[#order + 1] = key
    end
    freed[key] = (freed[key] or 0) + tonumber(count)
  end
  redis.call('ZREM', K_GROUP_GRANTS, unpack(old))
  for _, key in ipairs(order) do
    free_places(rate_field(key), key, freed[key], score_at(now))
  end
end

-- How many more of `key`'s messages may start now under its limits (nil: no bound).
local function group_room(key)
  local concurrency, max = group_limit(key)
  local counts = redis.call('HMGET', K_SERIAL_HOLD, key, rate_field(key))
  local room = concurrency and concurrency - (tonumber(counts[1]) or 0)
  if max then
    local left = max - (tonumber(counts[2]) or 0)
    room = room and math.min(room, left) or left
  end
  return room
end

-- The gate of one claim's group messages, for serial_gate: admit(key) counts a start
-- and returns nil, or returns until when (ms) the message waits at most (a safety
-- net: an ending lease or a grant leaving its window wakes it first); held(key) the
-- same without a start (nil: it could start); finish(token) writes the counts and
-- logs the grants once the claim has its token.
local function group_gate(now, lease_ms)
  local state, order = {}, {}
  local gate = {}
  function gate.held(key)
    local g = state[key]
    if not g then
      local concurrency, max, per = group_limit(key)
      local counts = redis.call('HMGET', K_SERIAL_HOLD, key, rate_field(key))
      g = {running = tonumber(counts[1]) or 0, used = tonumber(counts[2]) or 0, started = 0,
        concurrency = concurrency, max = max, per = per}
      state[key] = g
      order[#order + 1] = key
    end
    if g.concurrency and g.running >= g.concurrency then
      return now + lease_ms
    end
    if g.max and g.used >= g.max then
      return now + g.per
    end
    return nil
  end
  -- Whether none of the group's messages runs (and one may start).
  function gate.idle(key)
    return not gate.held(key) and state[key].running == 0
  end
  function gate.admit(key)
    local until_ms = gate.held(key)
    if not until_ms then
      local g = state[key]
      g.running, g.used, g.started = g.running + 1, g.used + 1, g.started + 1
    end
    return until_ms
  end
  function gate.finish(token)
    for _, key in ipairs(order) do
      local g = state[key]
      if g.started > 0 then
        redis.call('HSET', K_SERIAL_HOLD, key, g.running)
        if g.max then
          redis.call('HSET', K_SERIAL_HOLD, rate_field(key), g.used)
          redis.call('ZADD', K_GROUP_GRANTS, fmt(now + g.per), key .. '\0' .. token .. '\0' .. g.started)
        end
      end
    end
  end
  return gate
end
