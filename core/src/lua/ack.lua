-- ack.lua: complete deliveries; only the delivery holding the lease may do so
-- (fencing: a worker whose lease expired cannot complete the re-delivery).
-- KEYS: see lib.lua.
-- ARGV[3..] pairs: id, lease (as claim returned it).
-- Returns one status per pair: 1 acked, 0 lease lost (the message lives on under
--   another delivery), -1 gone (already completed, cancelled or purged).
local ids, tokens = {}, {}
for i = 3, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
-- Whole-batch reads and writes: a fixed number of calls per batch, not per message.
local leases = redis.call('HMGET', K_LEASE, unpack(ids))
local result, done, others, other_at = {}, {}, {}, {}
for i, id in ipairs(ids) do
  if leases[i] == tokens[i] then
    done[#done + 1] = id
    result[i] = 1
  else
    others[#others + 1] = id
    other_at[#other_at + 1] = i
  end
end
if #others > 0 then
  local alive = redis.call('HMGET', K_MSG, unpack(others))
  for j, i in ipairs(other_at) do
    result[i] = alive[j] and 0 or -1
  end
end
if #done > 0 then
  redis.call('ZREM', K_INFLIGHT, unpack(done))
  forget(done)
  redis.call('HINCRBY', K_STATS, 'acked', #done)
end
return result
