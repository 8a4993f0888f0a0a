-- completed.lua: the bound on kept completed messages (QueueOptions::keep_completed).
-- Drop kept completed messages: those older than keep_ms and the oldest past keep
-- (at most 1000 of each per call, so that a lowered limit never blocks Redis for long;
-- later calls go on). With keep 0 what an earlier setting kept goes the same way.
local function trim_completed(now, keep, keep_ms)
  local old = redis.call('ZRANGEBYSCORE', K_DONE, '-inf', fmt(now - keep_ms), 'LIMIT', 0, 1000)
  if #old > 0 then
    redis.call('ZREM', K_DONE, unpack(old))
    redis.call('HDEL', K_DONE_MSG, unpack(old))
  end
  local over = redis.call('ZCARD', K_DONE) - keep
  if over > 0 then
    local oldest = redis.call('ZRANGE', K_DONE, 0, math.min(over, 1000) - 1)
    redis.call('ZREM', K_DONE, unpack(oldest))
    redis.call('HDEL', K_DONE_MSG, unpack(oldest))
  end
end
