-- ack.lua of the floor model (see claim.lua): complete deliveries of one claim, only
-- those the claim still holds, and delete them.
-- KEYS[1] in-flight ZSET   KEYS[2] payloads HASH
-- ARGV[1] the claim's lease   ARGV[2..] ids
-- Returns how many were acknowledged.
local ids = {}
for i = 2, #ARGV do
  ids[i - 1] = ARGV[i]
end
local held = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local lease = tonumber(ARGV[1])
local done, n = {}, 0
for i = 1, #ids do
  if tonumber(held[i]) == lease then
    n = n + 1
    done[n] = ids[i]
  end
end
if n > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  redis.call('HDEL', KEYS[2], unpack(done))
end
return n
