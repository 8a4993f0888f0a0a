-- pools.lua: the registry of live consumer pools.
-- A consumer pool says that it is alive for ttl ms more (its heartbeat, see beat.lua),
-- or with ttl 0 that it has stopped; entries past their expiry (a pool that died
-- without saying so) are dropped on the way, so the hash stays as small as the set of
-- live pools. Returns how many are alive.
local function register_pool(now, id, ttl, info)
  if ttl > 0 then
    redis.call('HSET', K_WORKERS, id, fmt(now + ttl) .. '|' .. fmt(now) .. '|' .. info)
  else
    redis.call('HDEL', K_WORKERS, id)
  end
  local entries = redis.call('HGETALL', K_WORKERS)
  local stale, alive = {}, 0
  for i = 1, #entries, 2 do
    local expires = tonumber(string.match(entries[i + 1], '^(%d+)|'))
    if expires and expires > now then
      alive = alive + 1
    else
      stale[#stale + 1] = entries[i]
    end
  end
  if #stale > 0 then
    redis.call('HDEL', K_WORKERS, unpack(stale))
  end
  return alive
end
