-- minutes_add.lua: a consumer pool adds what its handlers did since its last call to
-- the partition's per-minute records, and samples the backlog (scheduled, ready, in
-- flight) for the current minute when no pool has yet (the first call of a minute
-- does, and then drops the minutes past those kept). The records expire when no pool
-- writes for as long as they are kept. Formats: see the crate's metrics.rs.
-- ARGV[3] minutes kept   ARGV[4..] one delta each: "<minute> <handled> <failed>[ <bucket>:<count>...]"
--   (deltas of minutes no longer kept are dropped; a pool's clock may run a minute ahead)
-- Returns the current minute (queue clock ms / 60000).
-- Faults: every delta is read before the first write; a malformed one is a caller bug.
-- @include clock
-- KEYS: scheduled inflight minutes control
local MINUTE_MS = 60000
local now = queue_now(false)
local minute = math.floor(now / MINUTE_MS)
local keep = tonumber(ARGV[3])
if not keep or keep < 1 then
  return redis.error_reply('DQERR minutes kept must be at least 1, got ' .. tostring(ARGV[3]))
end
local oldest = minute - keep + 1

local deltas = {}
for i = 4, #ARGV do
  local m, handled, failed, rest = string.match(ARGV[i], '^(%d+) (%d+) (%d+)(.*)$')
  if not m or (string.gsub(rest, ' %d+:%d+', '')) ~= '' then
    return redis.error_reply('DQERR malformed minute delta ' .. ARGV[i])
  end
  m = tonumber(m)
  if m >= oldest and m <= minute + 1 then
    local late = {}
    for k, n in string.gmatch(rest, ' (%d+):(%d+)') do
      late[#late + 1] = {tonumber(k), tonumber(n)}
    end
    deltas[#deltas + 1] = {m, tonumber(handled), tonumber(failed), late}
  end
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

local touched = {}
for _, d in ipairs(deltas) do
  local m = d[1]
  local rec = touched[m] or read_minute(m)
  touched[m] = rec
  rec.handled = rec.handled + d[2]
  rec.failed = rec.failed + d[3]
  for _, kn in ipairs(d[4]) do
    rec.late[kn[1]] = (rec.late[kn[1]] or 0) + kn[2]
  end
end

local current = touched[minute] or read_minute(minute)
local sampling = current.backlog[1] < 0
if sampling then
  local waiting = redis.call('ZCARD', K_SCHED)
  local ready = redis.call('ZCOUNT', K_SCHED, '-inf', fmt(due_bound(now)))
  current.backlog = {waiting - ready, ready, redis.call('ZCARD', K_INFLIGHT)}
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
