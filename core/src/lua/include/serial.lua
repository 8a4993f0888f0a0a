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
-- Groups share this machinery: a group's key is "\1" and its name (a serial key has no
-- control character, so the two never meet). Its holders entry counts its running
-- deliveries instead of naming one, and its limits (include/group_limits.lua) decide
-- which of its messages wait in its line.

local function is_group(key)
  return string.byte(key, 1) == 1
end


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

-- The first of `key`'s line that still waits goes back to the score it was due at; a
-- group's, given `at` (a score for now), to `at` if later: behind what is due now, so
-- that groups take turns rather than the group that just ran going first again.
-- Returns whether one did.
local function wake_line(key, at)
  while true do
    local first = redis.call('ZRANGEBYLEX', K_SERIAL_LINE, '[' .. key .. '\0', '(' .. key .. '\1', 'LIMIT', 0, 1)[1]
    if not first then
      return false
    end
    local score, id = line_entry(first, key)
    if at and is_group(key) and at > tonumber(score) then
      score = fmt(at)
    end
    redis.call('ZREM', K_SERIAL_LINE, first)
    redis.call('HDEL', K_SERIAL_LINED, id)
    if redis.call('ZSCORE', K_SCHED, id) then
      local old_head = head_score()
      redis.call('ZADD', K_SCHED, score, id)
      wake_if_earlier(old_head, tonumber(score))
      return true
    end
  end
end

-- `n` places of group `key` are free, counted in its holders entry `field` (its
-- running deliveries, or its starts in its rate window): the count drops by n, and as
-- many of its line wake, behind `at` when given.
local function free_places(field, key, n, at)
  -- Not a count: an older build took the group for a serial key; start afresh.
  local left = (tonumber(redis.call('HGET', K_SERIAL_HOLD, field)) or 0) - n
  if left > 0 then
    redis.call('HSET', K_SERIAL_HOLD, field, left)
  else
    redis.call('HDEL', K_SERIAL_HOLD, field)
  end
  for _ = 1, n do
    if not wake_line(key, at) then
      break
    end
  end
end

-- The leases of ids[first..last] (default: all) ended: the keys they held are free,
-- and their lines move on (groups' behind what is due at `now`, when given).
local function free_serial_keys(ids, first, last, now)
  first, last = first or 1, last or #ids
  if last < first or redis.call('EXISTS', K_SERIAL_HOLD) == 0 then
    return
  end
  if first ~= 1 or last ~= #ids then
    ids = {unpack(ids, first, last)}
  end
  local keys = redis.call('HMGET', K_SERIAL, unpack(ids))
  -- Each ended lease of a group frees one of its places: the first of its line for
  -- each (a group at its limit after a lowered limit holds a woken one back again).
  local groups, freed = {}, {}
  for i = 1, #ids do
    local key = keys[i]
    if key and is_group(key) then
      if not freed[key] then
        groups[#groups + 1] = key
      end
      freed[key] = (freed[key] or 0) + 1
    elseif key and redis.call('HGET', K_SERIAL_HOLD, key) == ids[i] then
      redis.call('HDEL', K_SERIAL_HOLD, key)
      wake_line(key)
    end
  end
  for _, key in ipairs(groups) do
    free_places(key, key, freed[key], now and score_at(now))
  end
end

-- Which of the messages a claim took from the schedule may run: returns the set of
-- indexes that may not (their key is held, by a running delivery or by an earlier
-- message of this claim), which are back in the schedule and in their key's line, and
-- every message's key (false for none), which the claim hands to the handler.
-- groups: the claim's gate of group messages (group_gate in include/group_gate.lua).
-- Once `room` messages may run, the others are left where they are (also in blocked),
-- but for those of groups at their limits: they go to their lines, so that the next
-- claims read past a group's backlog once. Groups take turns: the first message of
-- each group that runs nothing goes first, then the rest in due order.
local function serial_gate(ids, envelopes, scores, now, lease_ms, groups, room)
  local keys = redis.call('HMGET', K_SERIAL, unpack(ids))
  local blocked, taken, back = {}, {}, {}
  local admitted, first = 0, {}
  for i = 1, #ids do
    local key = keys[i]
    if admitted < room and key and envelopes[i] and is_group(key) and groups.idle(key) then
      groups.admit(key)
      unline({ids[i]})
      first[i] = true
      admitted = admitted + 1
    end
  end
  for i = 1, #ids do
    local key, id = keys[i], ids[i]
    local full = admitted >= room
    if first[i] then
      -- Taken above.
    elseif not (key and envelopes[i]) or (full and not is_group(key)) then
      if full then
        blocked[i] = true
      else
        admitted = admitted + 1
      end
    else
      local until_ms
      if is_group(key) then
        if full then
          -- Left where it is unless its group is at its limits.
          until_ms = groups.held(key)
          blocked[i] = true
        else
          until_ms = groups.admit(key)
        end
      elseif taken[key] then
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
      elseif not full then
        admitted = admitted + 1
        if not is_group(key) then
          taken[key] = id
          redis.call('HSET', K_SERIAL_HOLD, key, id)
        end
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
