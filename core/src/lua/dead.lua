-- dead.lua: list dead letters, newest first.
-- ARGV[3] limit   ARGV[4] how many to skip first (paging)   ARGV[5] largest envelope
--   sent whole, in bytes   ARGV[6] largest error text and ARGV[7] largest trace sent
--   whole (longer ones are cut, see include/shown.lua)
-- Returns groups of 6: id, dead_at_ms, envelope ("" when none; its size in bytes, a
-- number, when it is larger than ARGV[5]: it is not read), attempts, last_error,
-- error_trace ("" when none).
-- Faults: it writes nothing.
-- @include shown
-- KEYS: messages attempts errors dead traces
local start = tonumber(ARGV[4])
local max_envelope, max_error, max_trace = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local listed = redis.call('ZREVRANGE', K_DEAD, start, start + tonumber(ARGV[3]) - 1, 'WITHSCORES')
local result = {}
if #listed == 0 then
  return result
end
local ids = {}
for i = 1, #listed, 2 do
  ids[#ids + 1] = listed[i]
end
local envelopes = sized_values(K_MSG, ids, max_envelope)
local attempts = redis.call('HMGET', K_ATT, unpack(ids))
local errors = redis.call('HMGET', K_ERR, unpack(ids))
local traces = redis.call('HMGET', K_TRACE, unpack(ids))
for i, id in ipairs(ids) do
  result[#result + 1] = id
  result[#result + 1] = tonumber(listed[2 * i])
  result[#result + 1] = envelopes[i] or ''
  result[#result + 1] = tonumber(attempts[i] or '0')
  result[#result + 1] = cut_text(errors[i], max_error) or ''
  result[#result + 1] = cut_text(traces[i], max_trace) or ''
end
return result
