-- ack.lua: complete deliveries; only the delivery holding the lease may do so
-- (fencing: a worker whose lease expired cannot complete the re-delivery).
-- KEYS: see lib.lua.
-- ARGV[3..] pairs: id, token.
-- Returns one status per pair: 1 acked, 0 lease lost (the message lives on under
--   another delivery), -1 gone (already completed, cancelled or purged).
local result, done = {}, {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = lease_token(redis.call('HGET', K_LEASE, id))
  if held == token then
    done[#done + 1] = id
    result[#result + 1] = 1
  elseif redis.call('HEXISTS', K_MSG, id) == 1 then
    result[#result + 1] = 0
  else
    result[#result + 1] = -1
  end
end
if #done > 0 then
  redis.call('ZREM', K_INFLIGHT, unpack(done))
  forget(done)
  redis.call('HINCRBY', K_STATS, 'acked', #done)
end
return result
