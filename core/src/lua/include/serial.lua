-- serial.lua: serial keys (messages sharing a key never run at the same time).
-- @include claims
-- @include order
-- @include schedule
-- Serial keys. A claimed message whose key another delivery holds does not run: it
-- goes back to the schedule, due when the holder's lease would end (a safety net: the
-- holder's end wakes it much earlier), and takes its place in the key's line, by the
-- score it was due at. When a holder's lease ends (ack, failure, release, expiry), the
-- first of the line goes back to that score: due at once, ahead of what came due later.
-- Costs nothing while no message of the queue has a key (the hashes do not exist).


-- Take ids out of their lines (claimed, cancelled, rescheduled, replaced, gone).
local function unline(ids)
  if #ids == 0 or redis.call('EXISTS', K_SERIAL_LINED) == 0 then
    return
  end
  local members = redis.call('HMGET', K_SERIAL_LINED, unpack(ids))
  local gone = {}
  for i = 1, #ids do
    if members[i] then
      gone[#gone + 1] = members[i]
    end
  end
  if #gone > 0 then
    redis.call('ZREM', K_SERIAL_LINE, unpack(gone))
    redis.call('HDEL', K_SERIAL_LINED, unpack(ids))
  end
end

-- The first of `key`'s line that still waits goes back to the score it was due at.
local function wake_line(key)
  while true do
    local first = redis.call('ZRANGEBYLEX', K_SERIAL_LINE, '[' .. key .. '\0', '(' .. key .. '\1', 'LIMIT', 0, 1)[1]
    if not first then
      return
    end
    local score, id = line_entry(first, key)
    redis.call('ZREM', K_SERIAL_LINE, first)
    redis.call('HDEL', K_SERIAL_LINED, id)
    if redis.call('ZSCORE', K_SCHED, id) then
      local old_head = head_score()
      redis.call('ZADD', K_SCHED, score, id)
      wake_if_earlier(old_head, tonumber(score))
      return
    end
  end
end

-- The leases of ids[first..last] (default: all) ended: the keys they held are free,
-- and their lines move on.
local function free_serial_keys(ids, first, last)
  first, last = first or 1, last or #ids
  if last < first or redis.call('EXISTS', K_SERIAL_HOLD) == 0 then
    return
  end
  if first ~= 1 or last ~= #ids then
    ids = {unpack(ids, first, last)}
  end
  local keys = redis.call('HMGET', K_SERIAL, unpack(ids))
  for i = 1, #ids do
    local key = keys[i]
    if key and redis.call('HGET', K_SERIAL_HOLD, key) == ids[i] then
      redis.call('HDEL', K_SERIAL_HOLD, key)
      wake_line(key)
    end
  end
end

-- Which of the messages a claim took from the schedule may run: returns the set of
-- indexes that may not (their key is held, by a running delivery or by an earlier
-- message of this claim), which are back in the schedule and in their key's line, and
-- every message's key (false for none), which the claim hands to the handler.
local function serial_gate(ids, envelopes, scores, now, lease_ms)
  local keys = redis.call('HMGET', K_SERIAL, unpack(ids))
  local blocked, taken, back = {}, {}, {}
  for i = 1, #ids do
    local key, id = keys[i], ids[i]
    if key and envelopes[i] then
      local until_ms
      if taken[key] then
        until_ms = now + lease_ms
      else
        local holder = redis.call('HGET', K_SERIAL_HOLD, key)
        if holder and holder ~= id then
          until_ms = lease_deadline(holder)
        end
      end
      if until_ms then
        blocked[i] = true
        -- Already in line when its safety net brought it back: its place is kept.
        if not redis.call('HGET', K_SERIAL_LINED, id) then
          local member = key .. '\0' .. string.format('%017.0f', tonumber(scores[i])) .. '\0' .. id
          redis.call('ZADD', K_SERIAL_LINE, 0, member)
          redis.call('HSET', K_SERIAL_LINED, id, member)
        end
        back[#back + 1] = until_ms
        back[#back + 1] = id
      else
        taken[key] = id
        redis.call('HSET', K_SERIAL_HOLD, key, id)
        unline({id})
      end
    end
  end
  if #back > 0 then
    for j = 1, #back, 2 do
      back[j] = score_at(back[j])
    end
    redis.call('ZADD', K_SCHED, unpack(back))
  end
  return blocked, keys
end
