-- restart.lua: ask every consumer pool running on the queue, on any host and in any
-- language, to stop gracefully (finish its running handlers, give back the rest):
-- after a deploy, so that the process manager starts the new code, as Laravel's
-- queue:restart does. Workers started after the request are not affected: a claim
-- reports how many requests were made, and each pool compares that with the count
-- when its worker started (a count, so a step of the Redis clock changes nothing).
-- Returns the ids of the pools alive when asked: read here, in the same script, since
--   an idle pool woken by the request may have stopped and said goodbye before the
--   caller could read the list on its own.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- KEYS: workers control
local now = queue_now(true)
-- Pools compare the generation, which a step of the Redis clock cannot move; the
-- time stays for the record (and for pools of older versions during a deploy).
redis.call('HINCRBY', K_CONTROL, 'restart_gen', 1)
redis.call('HSET', K_CONTROL, 'restart_at', fmt(now))
-- Idle pools sleep until their next due time; a wake-up for now makes them claim at
-- once, and the claim's reply tells them.
redis.call('PUBLISH', CHANNEL, fmt(now))
local entries = redis.call('HGETALL', K_WORKERS)
local alive = {}
for i = 1, #entries, 2 do
  local expires = tonumber(string.match(entries[i + 1], '^(%d+)|'))
  if expires and expires > now then
    alive[#alive + 1] = entries[i]
  end
end
return alive
