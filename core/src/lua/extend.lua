-- extend.lua: heartbeat: push the lease deadline of running deliveries forward.
-- KEYS: see lib.lua.
-- ARGV[3] lease_ms   ARGV[4..] pairs: id, lease (as claim returned it).
-- Returns one status per pair: 1 extended, 0 lease lost.
local now = now_ms()
local deadline = now + tonumber(ARGV[3])
local result = {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', K_LEASE, id) == token then
    redis.call('ZADD', K_INFLIGHT, 'XX', deadline, id)
    result[#result + 1] = 1
  else
    result[#result + 1] = 0
  end
end
return result
