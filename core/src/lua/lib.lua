-- lib.lua: prelude that the crate prepends to every script below (Redis Lua has no
-- `require`). Every script receives the same KEYS, in this order, so that the Rust
-- side builds one key list per queue and every key carries the queue's hash tag:
--   KEYS[1] scheduled  ZSET  id -> score (due time, see score_of)
--   KEYS[2] messages   HASH  id -> envelope (opaque to Lua: payload bytes never pass
--                            through cjson, so 64-bit integers and key order survive)
--   KEYS[3] inflight   ZSET  id -> lease deadline (ms, server clock)
--   KEYS[4] leases     HASH  id -> "<token>:<score>" of the current delivery
--   KEYS[5] attempts   HASH  id -> finished deliveries (written when a delivery fails
--                            or its lease expires; the running one is attempts + 1)
--   KEYS[6] errors     HASH  id -> last error text
--   KEYS[7] dead       ZSET  id -> time of death (ms)
--   KEYS[8] stats      HASH  counters: pushed delivered acked retried dead ...
--   KEYS[9] seq        STRING  monotonic counter (FIFO order and lease tokens)
--   KEYS[10] workers   HASH  pool id -> "<expires_ms>|<seen_ms>|<info JSON>" of the
--                            consumer pools alive (see beat.lua)
--   KEYS[11] paused    HASH  since -> time of the pause (ms); while it exists, consumers
--                            claim nothing (see pause.lua)
--   KEYS[12] repeats   HASH  name -> definition of a repeating message (JSON text the
--                            crate writes and reads; opaque here, compared whole)
--   KEYS[13] repeat_marks HASH name -> due time (ms) of the latest occurrence pushed:
--                            each occurrence is pushed at most once
--   KEYS[14] limit     HASH  the rate limit (see limit.lua): max (this partition's
--                            share), per (ms), total (the queue's max), used (grants
--                            still in the window)
--   KEYS[15] limit_log ZSET  "<seq>:<count>" -> time (ms) of each claim's grant under
--                            the rate limit, for as long as it is in the window
--   KEYS[16] control   HASH  restart_at -> time (ms) of the latest request that running
--                            consumer pools stop (see restart.lua)
--   KEYS[17] completed ZSET  id -> time (ms) it was acknowledged, for the messages kept
--                            after completion (QueueOptions::keep_completed)
--   KEYS[18] completed_messages HASH id -> "<attempts>|<due_ms>|<envelope>" of each
--                            kept completed message
--   KEYS[19] traces    HASH  id -> stack trace of the last error, when the handler's
--                            language gave one (a failed delivery without one clears it)
--   KEYS[20] serial_keys HASH id -> serial key of a message pushed with one: messages
--                            sharing it never run at the same time (see serial_gate)
--   KEYS[21] serial_holders HASH serial key -> id of the delivery that holds it (while
--                            that id holds a lease)
--   KEYS[22] serial_line ZSET "<key>\0<score>\0<id>" (scores all 0: ordered by key, then
--                            by the score the message was due at): messages waiting
--                            for their key
--   KEYS[23] serial_lined HASH id -> its member of serial_line
-- ARGV[1] is the layout ("native" or "seed"), ARGV[2] the wake-up channel.
-- Scripts return error replies only for caller bugs, as "DQERR <code> <detail>".
local K_SCHED, K_MSG, K_INFLIGHT, K_LEASE, K_ATT, K_ERR, K_DEAD, K_STATS, K_SEQ, K_WORKERS, K_PAUSED =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local K_REPEATS, K_MARKS, K_LIMIT, K_LIMIT_LOG, K_CONTROL = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local K_DONE, K_DONE_MSG, K_TRACE = KEYS[17], KEYS[18], KEYS[19]
local K_SERIAL, K_SERIAL_HOLD, K_SERIAL_LINE, K_SERIAL_LINED = KEYS[20], KEYS[21], KEYS[22], KEYS[23]
local LAYOUT, CHANNEL = ARGV[1], ARGV[2]
local SEED = LAYOUT == 'seed'

-- Native scores pack a sequence number into the low 12 bits so that messages due in
-- the same millisecond keep push order (BullMQ does the same). due_ms * 4096 stays
-- below 2^53, where doubles hold every integer, for due times until September 2039;
-- a later due time is rounded to a multiple of 2 (8 by the year 2150), which can
-- reorder messages due in the same millisecond and make one up to 1 ms late, never
-- early. The seed layout keeps the recipe's whole-second scores so the recipe's own
-- consumers keep working.
local SEQ_SPAN = 4096

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- A Redis at its maxmemory refuses a script's first write when that command could take
-- memory, and lets a script that has written already run to its end (it cannot stop
-- one halfway). The scripts that drain the queue (claim, ack, nack, release, extend, a
-- pool's heartbeat) free memory or move entries between keys, and must not be refused
-- then, or a full Redis would stay full: they begin with this write, which takes none
-- and changes nothing (so it is not replicated either). Pushes are refused whole, before
-- anything is written.
local function run_even_out_of_memory()
  redis.call('HDEL', K_STATS, '')
end

local function next_seq(count)
  return redis.call('INCRBY', K_SEQ, count or 1)
end

local function score_of(due_ms, seq)
  if SEED then
    -- Rounded up: a message may be late by the recipe's one-second grain, never early.
    return math.ceil(due_ms / 1000)
  end
  return due_ms * SEQ_SPAN + (seq % SEQ_SPAN)
end

local function due_of(score)
  if SEED then
    return score * 1000
  end
  return math.floor(score / SEQ_SPAN)
end

-- Highest score that is due at `ms`.
local function due_bound(ms)
  if SEED then
    return math.floor(ms / 1000)
  end
  return ms * SEQ_SPAN + SEQ_SPAN - 1
end

-- An expiring message's envelope ends with ,"expire_after_ms":<n>,"expires_ms":<ms>}
-- (envelope.rs writes it last); a new due time sets the deadline to due + n. Only the
-- last bytes are searched, so the payload's size costs nothing, and a payload cannot
-- end the envelope this way (it is followed by the closing brace). Other envelopes,
-- and the seed layout's bare payloads, come back as they are.
local EXPIRY_TAIL = ',"expire_after_ms":(%d+),"expires_ms":%-?%d+}$'
local function with_deadline(envelope, due_ms)
  if SEED then
    return envelope
  end
  local start, _, after = string.find(envelope, EXPIRY_TAIL, math.max(1, #envelope - 80))
  if not start then
    return envelope
  end
  return string.sub(envelope, 1, start - 1) .. ',"expire_after_ms":' .. after .. ',"expires_ms":'
    .. fmt(due_ms + tonumber(after)) .. '}'
end

local function head_score()
  local head = redis.call('ZRANGE', K_SCHED, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end

-- Idle consumers sleep until the earliest due time on a client-side timer; a
-- message that becomes the new head must wake them, so its due time is published.
local function wake_if_earlier(old_head, lowest_added)
  if lowest_added and (old_head == nil or lowest_added < old_head) then
    redis.call('PUBLISH', CHANNEL, fmt(due_of(lowest_added)))
  end
end

local function wake_if_new_head(old_head)
  wake_if_earlier(old_head, head_score())
end

-- A lease is "<token>:<score>": the fencing token of one claim (unique; one claim's
-- deliveries share it, and one claim holds a message at most once) and the schedule
-- score the message was claimed at (a release puts it back there, and it gives the
-- due time). Completions send the whole string back and compare it as one value: no
-- parsing on the hot path. Which delivery of the message this is needs no storing:
-- attempts holds the finished ones, so the running one is attempts + 1.
local function lease_parts(lease)
  local token, score = string.match(lease, '^([^:]+):([^:]+)$')
  return token, tonumber(score)
end

-- Redis stores a small hash as a listpack and converts it once it passes
-- hash-max-listpack-entries (128); filling a fresh listpack with a claim of 1000
-- leases costs about 4x what the same writes cost in a hashtable (measured: 1.4 ms
-- against 0.37 ms per 1000 on Redis 7.0), and the leases hash is fresh whenever the
-- pool has caught up (an empty hash is deleted). One value longer than
-- hash-max-listpack-value (64) in the same HSET makes Redis build a hashtable from
-- the start; Redis never turns it back, so the field can go at once. Ids are never
-- empty, so the empty field name is free.
local LISTPACK_BREAKER = string.rep('-', 65)
local function hset_as_hashtable(key, pairs)
  local n = #pairs
  pairs[n + 1] = ''
  pairs[n + 2] = LISTPACK_BREAKER
  redis.call('HSET', key, unpack(pairs))
  redis.call('HDEL', key, '')
end

-- Attempts and errors exist only for messages that failed before; while none has,
-- their hashes do not exist and the per-message deletes are skipped.
local function hdel_if_any(key, ids)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HDEL', key, unpack(ids))
  end
end

-- Drop kept completed messages: those older than keep_ms and the oldest past keep
-- (at most 1000 of each per call, so that a lowered limit never blocks Redis for long;
-- later calls go on). With keep 0 what an earlier setting kept goes the same way.
local function trim_completed(now, keep, keep_ms)
  local old = redis.call('ZRANGEBYSCORE', K_DONE, '-inf', fmt(now - keep_ms), 'LIMIT', 0, 1000)
  if #old > 0 then
    redis.call('ZREM', K_DONE, unpack(old))
    redis.call('HDEL', K_DONE_MSG, unpack(old))
  end
  local over = redis.call('ZCARD', K_DONE) - keep
  if over > 0 then
    local oldest = redis.call('ZRANGE', K_DONE, 0, math.min(over, 1000) - 1)
    redis.call('ZREM', K_DONE, unpack(oldest))
    redis.call('HDEL', K_DONE_MSG, unpack(oldest))
  end
end

-- Serial keys. A claimed message whose key another delivery holds does not run: it
-- goes back to the schedule, due when the holder's lease would end (a safety net: the
-- holder's end wakes it much earlier), and takes its place in the key's line, by the
-- score it was due at. When a holder's lease ends (ack, failure, release, expiry), the
-- first of the line goes back to that score: due at once, ahead of what came due later.
-- Costs nothing while no message of the queue has a key (the hashes do not exist).

-- A member of key's line: the score it was due at (its digits, as text) and its id.
local function line_entry(member, key)
  return string.match(string.sub(member, #key + 2), '^(%d+)%z(.*)$')
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

-- The leases of ids ended: the keys they held are free, and their lines move on.
local function free_serial_keys(ids)
  if #ids == 0 or redis.call('EXISTS', K_SERIAL_HOLD) == 0 then
    return
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
          until_ms = tonumber(redis.call('ZSCORE', K_INFLIGHT, holder))
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
    local seq = next_seq(#back / 2)
    for j = 1, #back, 2 do
      back[j] = score_of(back[j], seq - #back / 2 + (j + 1) / 2)
    end
    redis.call('ZADD', K_SCHED, unpack(back))
  end
  return blocked, keys
end

local function forget(ids)
  if #ids == 0 then
    return
  end
  if redis.call('EXISTS', K_SERIAL) == 1 then
    unline(ids)
    redis.call('HDEL', K_SERIAL, unpack(ids))
  end
  redis.call('HDEL', K_MSG, unpack(ids))
  hdel_if_any(K_ATT, ids)
  hdel_if_any(K_ERR, ids)
  hdel_if_any(K_TRACE, ids)
  redis.call('HDEL', K_LEASE, unpack(ids))
end

-- A consumer pool says that it is alive for ttl ms more (its heartbeat, see beat.lua),
-- or with ttl 0 that it has stopped; entries past their expiry (a pool that died
-- without saying so) are dropped on the way, so the hash stays as small as the set of
-- live pools. Returns how many are alive.
local function register_pool(now, id, ttl, info)
  if ttl > 0 then
    redis.call('HSET', K_WORKERS, id, fmt(now + ttl) .. '|' .. fmt(now) .. '|' .. info)
  else
    redis.call('HDEL', K_WORKERS, id)
  end
  local entries = redis.call('HGETALL', K_WORKERS)
  local stale, alive = {}, 0
  for i = 1, #entries, 2 do
    local expires = tonumber(string.match(entries[i + 1], '^(%d+)|'))
    if expires and expires > now then
      alive = alive + 1
    else
      stale[#stale + 1] = entries[i]
    end
  end
  if #stale > 0 then
    redis.call('HDEL', K_WORKERS, unpack(stale))
  end
  return alive
end

-- The dead letters that requeue and delete act on: ARGV[3] is one id, or "" for the
-- oldest ARGV[4] (the caller repeats until a call returns fewer).
local function chosen_dead()
  if ARGV[3] ~= '' then
    if redis.call('ZSCORE', K_DEAD, ARGV[3]) then
      return {ARGV[3]}
    end
    return {}
  end
  return redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[4]) - 1)
end

-- Dead letters are capped by age and count so Redis memory cannot grow without bound;
-- envelopes go with their set entry, so nothing is left behind in the message hash.
local TRIM_STEP = 1000
local function trim_dead(now, dead_max, dead_ttl_ms)
  local old = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', fmt(now - dead_ttl_ms), 'LIMIT', 0, TRIM_STEP)
  local excess = redis.call('ZCARD', K_DEAD) - #old - dead_max
  if excess > 0 then
    local oldest = redis.call('ZRANGE', K_DEAD, #old, #old + math.min(excess, TRIM_STEP) - 1)
    for _, id in ipairs(oldest) do
      old[#old + 1] = id
    end
  end
  if #old > 0 then
    redis.call('ZREM', K_DEAD, unpack(old))
    forget(old)
    redis.call('HINCRBY', K_STATS, 'trimmed', #old)
  end
end


-- Repeating messages (see repeat_set.lua). Occurrence ids are "repeat:<name>:<due_ms>",
-- so an occurrence is found from its repeat's mark without an index.
local function occurrence_id(name, due)
  return 'repeat:' .. name .. ':' .. fmt(due)
end

-- Push the occurrence of `name` due at `due` (absolute ms) unless it exists, and mark
-- it as the repeat's latest. An expire_after deadline counts from `due`.
local function push_occurrence(name, due, envelope)
  local id = occurrence_id(name, due)
  if not redis.call('HGET', K_MSG, id) then
    local old_head = head_score()
    local score = score_of(due, next_seq())
    redis.call('HSET', K_MSG, id, with_deadline(envelope, due))
    redis.call('ZADD', K_SCHED, score, id)
    redis.call('HINCRBY', K_STATS, 'pushed', 1)
    wake_if_earlier(old_head, score)
  end
  redis.call('HSET', K_MARKS, name, fmt(due))
end

-- A repeat changed or went: its occurrence that still waits goes with it (one that
-- runs finishes).
local function cancel_pending_occurrence(name)
  local mark = redis.call('HGET', K_MARKS, name)
  if mark then
    local id = occurrence_id(name, tonumber(mark))
    if redis.call('ZREM', K_SCHED, id) == 1 then
      forget({id})
      redis.call('HINCRBY', K_STATS, 'cancelled', 1)
    end
    redis.call('HDEL', K_MARKS, name)
  end
end
