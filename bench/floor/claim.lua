-- claim.lua of the floor model (bench/model_floor.py): the least any implementation of
-- issue 2's data model must do to hand out due messages under a lease, with nothing
-- else (no attempts, stats, retries, dead letters, reaping, wake-ups). Not delayq.
-- KEYS[1] schedule ZSET id -> due (the recipe's whole seconds)
-- KEYS[2] payloads HASH id -> payload
-- KEYS[3] in-flight ZSET id -> lease: deadline (ms) * 4096 + a claim number in the low
--         bits. It stands for the fencing token as cheaply as one can: unique only
--         among 4096 claims in a row, so a real fence costs more than this.
-- KEYS[4] claim counter STRING
-- ARGV[1] highest due score to claim   ARGV[2] batch   ARGV[3] lease (ms)
-- Returns {lease, id1, payload1, ..., idn, payloadn}, or {} when nothing is due.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  return {}
end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local lease = string.format('%.0f', deadline * 4096 + redis.call('INCR', KEYS[4]) % 4096)
local leases, result = {}, {lease}
for i = 1, #ids do
  leases[2 * i - 1] = lease
  leases[2 * i] = ids[i]
  result[2 * i] = ids[i]
  result[2 * i + 1] = payloads[i]
end
redis.call('ZADD', KEYS[3], unpack(leases))
return result
