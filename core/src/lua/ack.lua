-- ack.lua: complete deliveries; only the delivery holding the lease may do so
-- (fencing: a worker whose lease expired cannot complete the re-delivery).
-- KEYS: see lib.lua.
-- ARGV[3..] pairs: id, lease (as claim returned it).
-- Returns one status per pair: 1 acked, 0 lease lost (the message lives on under
--   another delivery), -1 gone (already completed, cancelled or purged).
-- Counters rather than the # operator, which costs a search of the table per use.
local ids, tokens, n = {}, {}, 0
for i = 3, #ARGV, 2 do
  n = n + 1
  ids[n] = ARGV[i]
  tokens[n] = ARGV[i + 1]
end
-- Whole-batch reads and writes: a fixed number of calls per batch, not per message.
local leases = redis.call('HMGET', K_LEASE, unpack(ids))
local result, done, others, other_at = {}, {}, {}, {}
local n_done, n_others = 0, 0
for i = 1, n do
  if leases[i] == tokens[i] then
    n_done = n_done + 1
    done[n_done] = ids[i]
    result[i] = 1
  else
    n_others = n_others + 1
    others[n_others] = ids[i]
    other_at[n_others] = i
  end
end
if n_others > 0 then
  local alive = redis.call('HMGET', K_MSG, unpack(others))
  for j = 1, n_others do
    result[other_at[j]] = alive[j] and 0 or -1
  end
end
if n_done > 0 then
  redis.call('ZREM', K_INFLIGHT, unpack(done))
  forget(done)
  redis.call('HINCRBY', K_STATS, 'acked', n_done)
end
return result
