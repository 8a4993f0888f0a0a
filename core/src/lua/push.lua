-- push.lua: schedule one or many messages in one call; idempotent per id.
-- KEYS: see lib.lua.
-- ARGV[3..] groups of 4: id, kind ("d" = delay in ms from the server clock,
--   "a" = absolute Unix time in ms), ms, envelope.
-- Returns {now_ms, created1, due_ms1, created2, due_ms2, ...}; created is 0 when the id
--   already existed (then nothing was written for it and due_ms is its current due
--   time, or -1 when it is no longer scheduled).
local now = now_ms()
local old_head = head_score()
local count = (#ARGV - 2) / 4
local seq = next_seq(count)
local result = {now}
local adds, envelopes, seen, ids = {}, {}, {}, {}
for i = 0, count - 1 do
  ids[i + 1] = ARGV[3 + i * 4]
end
-- One read for the whole batch (HMGET: there is no variadic HEXISTS); ids are fresh
-- UUIDs unless the caller chose them, so the envelopes it returns are nearly all nil.
local existing = redis.call('HMGET', K_MSG, unpack(ids))
local created, lowest = 0, nil
for i = 0, count - 1 do
  local base = 3 + i * 4
  local id, kind, ms, envelope = ids[i + 1], ARGV[base + 1], tonumber(ARGV[base + 2]), ARGV[base + 3]
  -- HSETNX-like check, but also against ids earlier in this same batch.
  if existing[i + 1] or seen[id] then
    local score = redis.call('ZSCORE', K_SCHED, id)
    result[#result + 1] = 0
    result[#result + 1] = score and due_of(tonumber(score)) or -1
  else
    local due = ms
    if kind == 'd' then
      due = now + ms
    end
    local score = score_of(due, seq - count + 1 + i)
    if lowest == nil or score < lowest then
      lowest = score
    end
    adds[#adds + 1] = score
    adds[#adds + 1] = id
    seen[id] = true
    envelopes[#envelopes + 1] = id
    envelopes[#envelopes + 1] = envelope
    created = created + 1
    result[#result + 1] = 1
    result[#result + 1] = due_of(score)
  end
end
if created > 0 then
  redis.call('HSET', K_MSG, unpack(envelopes))
  redis.call('ZADD', K_SCHED, unpack(adds))
  redis.call('HINCRBY', K_STATS, 'pushed', created)
  -- The lowest new score is the new head when it beats the old one: no second read.
  wake_if_earlier(old_head, lowest)
end
return result
