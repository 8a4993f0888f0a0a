-- fenced_claim.lua: claim.lua of the floor model (see there) with an exact fence, as
-- issue 2 asks for one: every delivery gets a lease token no other delivery of the
-- message ever had, kept per message, so that an ack can tell this delivery from a
-- later one. Still nothing else (no attempts, counters, retries or reaping).
-- KEYS[1] schedule ZSET id -> due (the recipe's whole seconds)
-- KEYS[2] payloads HASH id -> payload
-- KEYS[3] in-flight ZSET id -> lease deadline (ms)
-- KEYS[4] claim counter STRING: the lease token, one per claim (a claim holds each of
--         its messages once, so the token names one delivery of each)
-- KEYS[5] leases HASH id -> token of its current delivery
-- ARGV[1] highest due score to claim   ARGV[2] batch   ARGV[3] lease (ms)
-- Returns {token, id1, payload1, ..., idn, payloadn}, or {} when nothing is due.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  return {}
end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
local t = redis.call('TIME')
local deadline = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3]))
local token = tostring(redis.call('INCR', KEYS[4]))
local deadlines, leases, result = {}, {}, {token}
for i = 1, #ids do
  deadlines[2 * i - 1] = deadline
  deadlines[2 * i] = ids[i]
  leases[2 * i - 1] = ids[i]
  leases[2 * i] = token
  result[2 * i] = ids[i]
  result[2 * i + 1] = payloads[i]
end
redis.call('ZADD', KEYS[3], unpack(deadlines))
-- A value past hash-max-listpack-value makes a fresh hash a hashtable at once, as
-- core/src/lua/lib.lua's hset_as_hashtable does: filling a listpack 1000 fields at a
-- time costs several times more, and a floor should not pay what can be avoided.
leases[#leases + 1] = ''
leases[#leases + 1] = string.rep('-', 65)
redis.call('HSET', KEYS[5], unpack(leases))
redis.call('HDEL', KEYS[5], '')
return result
