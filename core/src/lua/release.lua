-- release.lua: give back deliveries that a stopping worker prefetched but never
-- started: due again at once, at their old place, and the attempt does not count.
-- KEYS: see lib.lua.
-- ARGV[3..] pairs: id, token.
-- Returns the number released (pairs whose lease was lost are skipped).
local old_head = head_score()
local released = 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local lease = redis.call('HGET', K_LEASE, id)
  if lease_token(lease) == token then
    redis.call('ZREM', K_INFLIGHT, id)
    redis.call('HDEL', K_LEASE, id)
    if redis.call('HINCRBY', K_ATT, id, -1) <= 0 then
      redis.call('HDEL', K_ATT, id)
    end
    redis.call('ZADD', K_SCHED, score_of(lease_due(lease), next_seq()), id)
    released = released + 1
  end
end
if released > 0 then
  redis.call('HINCRBY', K_STATS, 'released', released)
  wake_if_new_head(old_head)
end
return released
