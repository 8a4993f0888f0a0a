-- ack.lua of the floors (see claim.lua): complete the deliveries of one claim that it
-- still holds, and delete them.
-- KEYS[1] in-flight ZSET   KEYS[2] payloads HASH   KEYS[3] leases HASH ("exact", "claim")
-- ARGV[1] fence: "score", "exact" or "claim"   ARGV[2] the claim's lease   ARGV[3..] ids
-- Returns how many were acknowledged.
local ids = {}
for i = 3, #ARGV do
  ids[i - 2] = ARGV[i]
end
local exact = ARGV[1] == 'exact'
local done, n = {}, 0
if ARGV[1] == 'claim' then
  -- The claim still holds what was stamped before it, as long as its record lives.
  local token = ARGV[2]
  local left = tonumber(redis.call('HGET', KEYS[3], token .. '#'))
  if not left then
    return 0
  end
  local claim, match = tonumber(token), string.match
  local stored = redis.call('HMGET', KEYS[2], unpack(ids))
  for i = 1, #ids do
    local stamp = stored[i] and tonumber(match(stored[i], '^(%d+)|'))
    if stamp and stamp < claim then
      n = n + 1
      done[n] = ids[i]
    end
  end
  if n > 0 then
    -- What was deleted, not what was asked: an id sent twice counts once.
    n = redis.call('HDEL', KEYS[2], unpack(done))
    if left <= n then
      redis.call('HDEL', KEYS[3], token, token .. '#')
      redis.call('ZREM', KEYS[1], token)
    else
      redis.call('HINCRBY', KEYS[3], token .. '#', -n)
    end
  end
  return n
end
if exact then
  local held, lease = redis.call('HMGET', KEYS[3], unpack(ids)), ARGV[2]
  for i = 1, #ids do
    if held[i] == lease then
      n = n + 1
      done[n] = ids[i]
    end
  end
else
  -- The lease comes back printed as a double, so it is compared as a number.
  local held, lease = redis.call('ZMSCORE', KEYS[1], unpack(ids)), tonumber(ARGV[2])
  for i = 1, #ids do
    if tonumber(held[i]) == lease then
      n = n + 1
      done[n] = ids[i]
    end
  end
end
if n > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('HDEL', KEYS[2], unpack(done))
  if exact then
    redis.call('HDEL', KEYS[3], unpack(done))
  end
end
return n
