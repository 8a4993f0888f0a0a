-- claim.lua of the floors (bench/model_floor.py): the steps that any implementation of
-- issue 2's data model cannot do without to hand out due messages under a lease, and
-- nothing else (no attempts, counters, retries, dead letters, reaping, wake-ups). Not
-- delayq. Two fences:
--   "score": the lease is the in-flight score, deadline (ms) * 4096 + a claim number
--            in the low bits, as cheap as a fence gets but unique only among 4096
--            claims in a row;
--   "exact": the fence issue 2 asks for: a token per claim (a claim holds each of its
--            messages once, so it names one delivery of each) kept per message.
--   "claim": a lease per claim (issue 29): one in-flight entry per claim (its token,
--            scored by its deadline) and one record of its ids, nothing written per
--            message. A message's side of the fence is in its stored text: the claim
--            number current when it was pushed or last put back ("<stamp>|<due>|",
--            which the scripts that schedule a message would write); a claim holds
--            a message stamped before it while the claim's record lives.
-- KEYS[1] schedule ZSET id -> due (the recipe's whole seconds)
-- KEYS[2] payloads HASH id -> payload
-- KEYS[3] in-flight ZSET id -> the "score" lease, or the lease deadline (ms) ("exact");
--         claim token -> its deadline (ms) ("claim")
-- KEYS[4] claim counter STRING
-- KEYS[5] leases HASH id -> token of its current delivery ("exact"); claim token -> its
--         ids, and token# -> how many it still holds ("claim")
-- ARGV[1] highest due score to claim   ARGV[2] batch   ARGV[3] lease (ms)
-- ARGV[4] fence: "score", "exact" or "claim"
-- Returns {lease, id1, payload1, ..., idn, payloadn}, or {} when nothing is due.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  return {}
end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local claim = redis.call('INCR', KEYS[4])
if ARGV[4] == 'claim' then
  local token = tostring(claim)
  redis.call('ZADD', KEYS[3], string.format('%.0f', deadline), token)
  redis.call('HSET', KEYS[5], token, table.concat(ids, '\n'), token .. '#', #ids)
  local result = {token}
  for i = 1, #ids do
    result[2 * i] = ids[i]
    result[2 * i + 1] = payloads[i]
  end
  return result
end
local exact = ARGV[4] == 'exact'
local lease, score
if exact then
  lease, score = tostring(claim), string.format('%.0f', deadline)
else
  lease = string.format('%.0f', deadline * 4096 + claim % 4096)
  score = lease
end
-- One loop per fence, so that neither pays for the other's steps.
local scores, leases, result = {}, {}, {lease}
if exact then
  for i = 1, #ids do
    scores[2 * i - 1] = score
    scores[2 * i] = ids[i]
    leases[2 * i - 1] = ids[i]
    leases[2 * i] = lease
    result[2 * i] = ids[i]
    result[2 * i + 1] = payloads[i]
  end
else
  for i = 1, #ids do
    scores[2 * i - 1] = score
    scores[2 * i] = ids[i]
    result[2 * i] = ids[i]
    result[2 * i + 1] = payloads[i]
  end
end
redis.call('ZADD', KEYS[3], unpack(scores))
if exact then
  -- A value past hash-max-listpack-value makes a fresh hash a hashtable at once, as
  -- core/src/lua/include/base.lua's hset_as_hashtable does: filling a listpack 1000 fields at
  -- a time costs several times more, and a floor should not pay what can be avoided.
  leases[#leases + 1] = ''
  leases[#leases + 1] = string.rep('-', 65)
  redis.call('HSET', KEYS[5], unpack(leases))
  redis.call('HDEL', KEYS[5], '')
end
return result
