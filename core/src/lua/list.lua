-- list.lua: the first messages of one state, in the order consumers will meet them.
-- ARGV[3] "waiting" (scheduled and ready, earliest due first), "inflight" (running,
--   earliest lease deadline first) or "completed" (kept after completion, latest
--   first)   ARGV[4] limit (1..1000)   ARGV[5] how many to skip first (paging)
--   ARGV[6] largest envelope sent whole, in bytes   ARGV[7] largest error text and
--   ARGV[8] largest trace sent whole (longer ones are cut, see include/shown.lua)
-- Returns {now_ms, then groups of 11: id, state, envelope (or its size in bytes, a
--   number, when it is larger than ARGV[6]: it is not read), due_ms (-1 unknown),
--   attempts (deliveries so far, the running one included), last_error or false,
--   lease_until_ms (-1 unless in flight), completed_at_ms (-1 unless completed),
--   error_trace or false, serial_key or false, held or false}. A message in its serial
--   key's or group's line shows when it was due, and why it waits (held, see
--   include/group_limits.lua); one woken from its group's line, when it was due (its
--   stamp's score, see get.lua).
-- Read-only; one call reads at most 1000 messages, so Redis is never blocked for long.
-- Faults: it writes nothing.
-- @include claims
-- @include clock
-- @include group_limits
-- @include shown
-- @include stamp
-- KEYS: scheduled messages inflight leases attempts errors control completed completed_messages traces serial_keys serial_holders serial_lined claims claim_ids
local now = queue_now(false)
local limit = tonumber(ARGV[4])
local start = tonumber(ARGV[5])
local max_envelope, max_error, max_trace = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if ARGV[3] == 'completed' then
  local listed = redis.call('ZREVRANGE', K_DONE, start, start + limit - 1, 'WITHSCORES')
  local result = {now}
  local ids = {}
  for i = 1, #listed, 2 do
    ids[#ids + 1] = listed[i]
  end
  local records = #ids > 0 and sized_values(K_DONE_MSG, ids, max_envelope) or {}
  for i = 1, #listed, 2 do
    local record = records[(i + 1) / 2]
    local attempts, due, kept
    if type(record) == 'number' then
      -- Its attempts and due time lead the record: read it for them, once, and send
      -- only its size (the reply, not this read, is what grows with every message).
      attempts, due = string.match(redis.call('HGET', K_DONE_MSG, listed[i]) or '', '^(%d+)|(-?%d+)|')
      kept = record
    elseif record then
      attempts, due, kept = string.match(record, '^(%d+)|(-?%d+)|(.*)$')
    end
    if attempts then
      local k = #result
      result[k + 1] = listed[i]
      result[k + 2] = 'completed'
      result[k + 3] = kept
      result[k + 4] = tonumber(due)
      result[k + 5] = tonumber(attempts)
      result[k + 6] = false
      result[k + 7] = -1
      result[k + 8] = tonumber(listed[i + 1])
      result[k + 9] = false
      result[k + 10] = false
      result[k + 11] = false
    end
  end
  return result
end
-- In flight: `limit` messages after the first `start`, earliest deadline first, as
-- {id1, deadline1, ...}: the claims' (include/claims.lua) and the detached
-- deliveries, merged. A claim's count skips it whole; one is read only to list it.
local function inflight_page()
  local detached = redis.call('ZRANGE', K_INFLIGHT, 0, start + limit - 1, 'WITHSCORES')
  local page, skip, o = {}, start, 1
  local function take(id, deadline)
    if skip > 0 then
      skip = skip - 1
    else
      page[#page + 1] = id
      page[#page + 1] = deadline
    end
  end
  local at = 0
  while #page < 2 * limit do
    local claims = redis.call('ZRANGE', K_CLAIMS, at, at + 99, 'WITHSCORES')
    at = at + 100
    for c = 1, #claims, 2 do
      local token, deadline = claims[c], tonumber(claims[c + 1])
      while detached[o] and tonumber(detached[o + 1]) <= deadline and #page < 2 * limit do
        take(detached[o], tonumber(detached[o + 1]))
        o = o + 2
      end
      local count = tonumber(redis.call('HGET', K_CLAIM_IDS, token .. '#')) or 0
      if skip >= count then
        skip = skip - count
      elseif #page < 2 * limit then
        local ids = {}
        held_by(token, ids)
        for _, id in ipairs(ids) do
          if #page < 2 * limit then
            take(id, deadline)
          end
        end
      end
    end
    if #claims < 200 then
      break
    end
  end
  while detached[o] and #page < 2 * limit do
    take(detached[o], tonumber(detached[o + 1]))
    o = o + 2
  end
  return page
end
local inflight = ARGV[3] == 'inflight'
local listed
if inflight then
  listed = inflight_page()
else
  listed = redis.call('ZRANGE', K_SCHED, start, start + limit - 1, 'WITHSCORES')
end
local result = {now}
local n = #listed / 2
if n == 0 then
  return result
end
local ids = {}
for i = 1, n do
  ids[i] = listed[2 * i - 1]
end
local envelopes = sized_values(K_MSG, ids, max_envelope)
local attempts = redis.call('HMGET', K_ATT, unpack(ids))
local errors = redis.call('HMGET', K_ERR, unpack(ids))
local traces = redis.call('HMGET', K_TRACE, unpack(ids))
local leases = inflight and redis.call('HMGET', K_LEASE, unpack(ids)) or {}
local serials, lined = {}, {}
if redis.call('EXISTS', K_SERIAL) == 1 then
  serials = redis.call('HMGET', K_SERIAL, unpack(ids))
  lined = redis.call('HMGET', K_SERIAL_LINED, unpack(ids))
end
local ready_bound = due_bound(now)
for i = 1, n do
  -- An id without an envelope (a hand edit, a foreign tool) has nothing to show.
  if envelopes[i] then
    local score = tonumber(listed[2 * i])
    local finished = tonumber(attempts[i]) or 0
    local state, due, attempt, lease_until, held = nil, nil, nil, nil, false
    if inflight then
      -- A left-out envelope's stamp is not read: its due time is then unknown.
      local stored = type(envelopes[i]) == 'string' and envelopes[i] or nil
      local claimed_at = leases[i] and (lease_score(leases[i]) or (stored and stamp_score(stored, now)))
      state, due, attempt, lease_until = 'inflight', claimed_at and due_of(claimed_at) or -1, finished + 1, score
    else
      if lined[i] then
        score = tonumber((line_entry(lined[i], serials[i])))
        held = why_held(serials[i])
      elseif serials[i] and string.byte(serials[i], 1) == 1 and type(envelopes[i]) == 'string' then
        score = stamp_score(envelopes[i], now) or score
      end
      state = score <= ready_bound and 'ready' or 'scheduled'
      due, attempt, lease_until = due_of(score), finished, -1
    end
    local k = #result
    result[k + 1] = ids[i]
    result[k + 2] = state
    result[k + 3] = envelopes[i]
    result[k + 4] = due
    result[k + 5] = attempt
    result[k + 6] = cut_text(errors[i], max_error)
    result[k + 7] = lease_until
    result[k + 8] = -1
    result[k + 9] = cut_text(traces[i], max_trace)
    result[k + 10] = serials[i] or false
    result[k + 11] = held
  end
end
return result
