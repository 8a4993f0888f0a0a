-- dead.lua: list dead letters, newest first.
-- ARGV[3] limit   ARGV[4] how many to skip first (paging).
-- Returns groups of 6: id, dead_at_ms, envelope, attempts, last_error, error_trace
-- ("" when none).
-- Faults: it writes nothing.
-- KEYS: messages attempts errors dead traces
local start = tonumber(ARGV[4])
local ids = redis.call('ZREVRANGE', K_DEAD, start, start + tonumber(ARGV[3]) - 1, 'WITHSCORES')
local result = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  result[#result + 1] = id
  result[#result + 1] = tonumber(ids[i + 1])
  result[#result + 1] = redis.call('HGET', K_MSG, id) or ''
  result[#result + 1] = tonumber(redis.call('HGET', K_ATT, id) or '0')
  result[#result + 1] = redis.call('HGET', K_ERR, id) or ''
  result[#result + 1] = redis.call('HGET', K_TRACE, id) or ''
end
return result
