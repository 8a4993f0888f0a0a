-- minutes.lua: a pool adds what its handlers did to the partition's per-minute
-- records, and the first call of a minute samples the backlog (scheduled, ready, in
-- flight) and drops the minutes past those kept. The records expire when no pool
-- writes for as long as they are kept. Formats: see the crate's metrics.rs. Used by
-- minutes_add.lua, and by claim.lua, whose claims carry the records when they can.
local MINUTE_MS = 60000

-- The deltas in words[from..to], each "<minute> <handled> <failed>[ <bucket>:<count>...]",
-- read before anything is written: the list, or nil and what is malformed.
local function read_minute_deltas(words, from, to)
  local deltas = {}
  for i = from, to do
    local m, handled, failed, rest = string.match(words[i] or '', '^(%d+) (%d+) (%d+)(.*)$')
    if not m or (string.gsub(rest, ' %d+:%d+', '')) ~= '' then
      return nil, 'malformed minute delta ' .. tostring(words[i])
    end
    local late = {}
    for k, n in string.gmatch(rest, ' (%d+):(%d+)') do
      late[#late + 1] = {tonumber(k), tonumber(n)}
    end
    deltas[#deltas + 1] = {tonumber(m), tonumber(handled), tonumber(failed), late}
  end
  return deltas
end

local function read_minute(m)
  local rec = {handled = 0, failed = 0, backlog = {-1, -1, -1}, late = {}}
  local v = redis.call('HGET', K_MINUTES, fmt(m))
  if v then
    local h, f, s, r, i, rest = string.match(v, '^(%d+) (%d+) (%-?%d+) (%-?%d+) (%-?%d+)(.*)$')
    if h then
      rec.handled, rec.failed = tonumber(h), tonumber(f)
      rec.backlog = {tonumber(s), tonumber(r), tonumber(i)}
      for k, n in string.gmatch(rest, ' (%d+):(%d+)') do
        rec.late[tonumber(k)] = (rec.late[tonumber(k)] or 0) + tonumber(n)
      end
    end
  end
  return rec
end

local function write_minute(m, rec)
  local buckets = {}
  for k in pairs(rec.late) do
    buckets[#buckets + 1] = k
  end
  table.sort(buckets)
  local words = {fmt(rec.handled), fmt(rec.failed), fmt(rec.backlog[1]), fmt(rec.backlog[2]), fmt(rec.backlog[3])}
  for _, k in ipairs(buckets) do
    words[#words + 1] = fmt(k) .. ':' .. fmt(rec.late[k])
  end
  redis.call('HSET', K_MINUTES, fmt(m), table.concat(words, ' '))
end

-- Add `deltas` (from read_minute_deltas; those of minutes no longer kept are dropped,
-- a pool's clock may run a minute ahead) with `keep` minutes kept. Returns the current
-- minute (queue clock ms / 60000).
local function add_minutes(now, keep, deltas)
  local minute = math.floor(now / MINUTE_MS)
  local oldest = minute - keep + 1
  local touched = {}
  for _, d in ipairs(deltas) do
    local m = d[1]
    if m >= oldest and m <= minute + 1 then
      local rec = touched[m] or read_minute(m)
      touched[m] = rec
      rec.handled = rec.handled + d[2]
      rec.failed = rec.failed + d[3]
      for _, kn in ipairs(d[4]) do
        rec.late[kn[1]] = (rec.late[kn[1]] or 0) + kn[2]
      end
    end
  end
  local current = touched[minute] or read_minute(minute)
  local sampling = current.backlog[1] < 0
  if sampling then
    local waiting = redis.call('ZCARD', K_SCHED)
    local ready = redis.call('ZCOUNT', K_SCHED, '-inf', fmt(due_bound(now)))
    current.backlog = {waiting - ready, ready, redis.call('HLEN', K_LEASE)}
    touched[minute] = current
  end
  for m, rec in pairs(touched) do
    write_minute(m, rec)
  end
  if sampling then
    local entries = redis.call('HGETALL', K_MINUTES)
    local gone = {}
    for i = 1, #entries, 2 do
      local m = tonumber(entries[i])
      if not m or m < oldest then
        gone[#gone + 1] = entries[i]
      end
    end
    if #gone > 0 then
      redis.call('HDEL', K_MINUTES, unpack(gone))
    end
  end
  if next(touched) then
    redis.call('PEXPIRE', K_MINUTES, keep * MINUTE_MS + MINUTE_MS)
  end
  return minute
end
