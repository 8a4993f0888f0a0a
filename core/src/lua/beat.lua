-- beat.lua: a consumer pool says that it is alive (when it starts and on every
-- heartbeat) or that it has stopped; entries past their expiry (a pool that died
-- without saying so) are dropped on the way, so the hash stays as small as the set of
-- live pools.
-- KEYS: see lib.lua.
-- ARGV[3] pool id   ARGV[4] ttl_ms, 0 when the pool has stopped   ARGV[5] info JSON
--   (opaque to Lua)
-- Returns the number of pools alive after this call.
local now = now_ms()
local id, ttl = ARGV[3], tonumber(ARGV[4])
if ttl > 0 then
  redis.call('HSET', K_WORKERS, id, fmt(now + ttl) .. '|' .. fmt(now) .. '|' .. ARGV[5])
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
