-- dead.lua: choosing and trimming dead letters.
-- @include forget
-- The dead letters that requeue and delete act on: ARGV[3] is one id, or "" for the
-- oldest ARGV[4] (the caller repeats until a call returns fewer).
local function chosen_dead()
  if ARGV[3] ~= '' then
    if redis.call('ZSCORE', K_DEAD, ARGV[3]) then
      return {ARGV[3]}
    end
    return {}
  end
  return redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[4]) - 1)
end

-- Dead letters are capped by age and count so Redis memory cannot grow without bound;
-- envelopes go with their set entry, so nothing is left behind in the message hash.
local TRIM_STEP = 1000
local function trim_dead(now, dead_max, dead_ttl_ms)
  local old = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', fmt(now - dead_ttl_ms), 'LIMIT', 0, TRIM_STEP)
  local excess = redis.call('ZCARD', K_DEAD) - #old - dead_max
  if excess > 0 then
    local oldest = redis.call('ZRANGE', K_DEAD, #old, #old + math.min(excess, TRIM_STEP) - 1)
    for _, id in ipairs(oldest) do
      old[#old + 1] = id
    end
  end
  if #old > 0 then
    redis.call('ZREM', K_DEAD, unpack(old))
    forget(old)
    redis.call('HINCRBY', K_STATS, 'trimmed', #old)
  end
end
