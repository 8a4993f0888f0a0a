-- fenced_ack.lua: ack.lua of the floor model with the exact fence of fenced_claim.lua:
-- complete the deliveries of one claim that it still holds, and delete them.
-- KEYS[1] in-flight ZSET   KEYS[2] payloads HASH   KEYS[3] leases HASH
-- ARGV[1] the claim's token   ARGV[2..] ids
-- Returns how many were acknowledged.
local ids = {}
for i = 2, #ARGV do
  ids[i - 1] = ARGV[i]
end
local held = redis.call('HMGET', KEYS[3], unpack(ids))
local token = ARGV[1]
local done, n = {}, 0
for i = 1, #ids do
  if held[i] == token then
    n = n + 1
    done[n] = ids[i]
  end
end
if n > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('HDEL', KEYS[2], unpack(done))
  redis.call('HDEL', KEYS[3], unpack(done))
end
return n
