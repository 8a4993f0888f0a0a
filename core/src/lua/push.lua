-- push.lua: schedule one or many messages in one call; idempotent per id.
-- KEYS: see lib.lua.
-- ARGV[3] "check": an id may exist already (the caller chose it, or this is a resend
--   of a call that may have run), so each is looked up and an existing one is left
--   as it is; "new": every id is one that delayq generated for this send, so none can
--   exist and the lookup is skipped.
-- ARGV[4..] groups of 4: id, kind ("d" = delay in ms from the server clock,
--   "a" = absolute Unix time in ms), ms, envelope.
-- Returns {now_ms, created}: how many messages were new (the others existed already).
local now = now_ms()
local old_head = head_score()
local FIRST = 4
local count = (#ARGV - FIRST + 1) / 4
local seq = next_seq(count)
local check = ARGV[3] == 'check'
local existing, seen = {}, {}
if check then
  local ids = {}
  for i = 1, count do
    ids[i] = ARGV[FIRST + (i - 1) * 4]
  end
  -- One read for the whole batch (HMGET: there is no variadic HEXISTS).
  existing = redis.call('HMGET', K_MSG, unpack(ids))
end
-- Counters rather than the # operator, which costs a search of the table per use.
local adds, envelopes, n_adds, lowest = {}, {}, 0, nil
for i = 1, count do
  local base = FIRST + (i - 1) * 4
  local id = ARGV[base]
  -- HSETNX-like check, but also against ids earlier in this same batch.
  if not (check and (existing[i] or seen[id])) then
    local due = tonumber(ARGV[base + 2])
    if ARGV[base + 1] == 'd' then
      due = now + due
    end
    local score = score_of(due, seq - count + i)
    if lowest == nil or score < lowest then
      lowest = score
    end
    adds[n_adds + 1] = score
    adds[n_adds + 2] = id
    envelopes[n_adds + 1] = id
    envelopes[n_adds + 2] = ARGV[base + 3]
    n_adds = n_adds + 2
    if check then
      seen[id] = true
    end
  end
end
local created = n_adds / 2
if created > 0 then
  redis.call('HSET', K_MSG, unpack(envelopes))
  redis.call('ZADD', K_SCHED, unpack(adds))
  redis.call('HINCRBY', K_STATS, 'pushed', created)
  -- The lowest new score is the new head when it beats the old one: no second read.
  wake_if_earlier(old_head, lowest)
end
return {now, created}
