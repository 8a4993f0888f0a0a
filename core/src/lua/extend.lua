-- extend.lua: heartbeat: push the lease deadline of running deliveries forward.
-- ARGV[3] lease_ms   ARGV[4..] pairs: id, lease (as claim returned it).
-- Returns one status per pair: 1 extended; 0 lease lost (another delivery holds the
--   message, or its lease expired and it waits to be delivered again); -1 the message
--   is gone (its completion was written while the heartbeat was on its way: no loss).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include oom
-- @include stall
-- KEYS: messages inflight leases stats control claims claim_ids
run_even_out_of_memory()
local now = queue_now(true)
absorb_stall(now, tonumber(ARGV[3]))
local deadline = now + tonumber(ARGV[3])
local result, claims = {}, {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local lease = redis.call('HGET', K_LEASE, id)
  if lease == token then
    claims[claim_token(lease)] = true
    result[#result + 1] = 1
  elseif lease or redis.call('HEXISTS', K_MSG, id) == 1 then
    result[#result + 1] = 0
  else
    result[#result + 1] = -1
  end
end
-- One deadline per claim.
for token in pairs(claims) do
  redis.call('ZADD', K_CLAIMS, 'XX', deadline, token)
end
return result
