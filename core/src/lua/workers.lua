-- workers.lua: the consumer pools registered by beat.lua.
-- Returns {now_ms, id1, entry1, id2, entry2, ...}, every entry as beat.lua stored it
--   ("<expires_ms>|<seen_ms>|<info JSON>"), expired ones included: the caller drops
--   those (a read writes nothing).
-- Faults: it writes nothing.
-- @include clock
-- KEYS: workers control
local result = {queue_now(false)}
for _, v in ipairs(redis.call('HGETALL', K_WORKERS)) do
  result[#result + 1] = v
end
return result
