-- stats.lua: queue depth by state plus the lifetime counters.
-- Returns {now_ms, waiting, ready, inflight, dead, next_due_ms or -1, paused_at_ms or
--   -1, rate limit's max or -1, its per (ms) or -1, completed messages kept, held, k1,
--   v1, k2, v2, ...} where waiting counts every scheduled entry, ready those already
--   due, held those in a serial key's line (see include/serial.lua): scheduled entries, due
--   already, that wait for another message of their key to finish.
-- Faults: it writes nothing.
-- @include clock
-- @include schedule
-- KEYS: scheduled leases dead stats paused limit control completed serial_line
local now = queue_now(false)
local waiting = redis.call('ZCARD', K_SCHED)
local ready = redis.call('ZCOUNT', K_SCHED, '-inf', fmt(due_bound(now)))
local head = head_score()
local result = {now, waiting, ready, redis.call('HLEN', K_LEASE), redis.call('ZCARD', K_DEAD),
  head and due_of(head) or -1, tonumber(redis.call('HGET', K_PAUSED, 'since')) or -1}
local limit = redis.call('HMGET', K_LIMIT, 'total', 'per')
result[8] = tonumber(limit[1]) or -1
result[9] = tonumber(limit[2]) or -1
result[10] = redis.call('ZCARD', K_DONE)
result[11] = redis.call('ZCARD', K_SERIAL_LINE)
for _, v in ipairs(redis.call('HGETALL', K_STATS)) do
  result[#result + 1] = v
end
return result
