-- claim.lua: hand up to ARGV[3] due messages to one consumer under a lease, after
-- re-scheduling deliveries whose lease expired (their worker died or hung).
-- ARGV[3] batch (1..1000)   ARGV[4] lease_ms   ARGV[5] dead_max   ARGV[6] dead_ttl_ms
-- ARGV[7] "1" to look for repeating messages with no occurrence pending (see below),
--   and to sweep a page of quarantine entries whose message no longer waits
-- ARGV[8..]: optional sections, each a name and its words, carried by a claim so that
--   they cost no command of their own: "beat" pool id, ttl_ms, info JSON (the claiming
--   pool's heartbeat, see beat.lua); "minutes" minutes kept, n, then n deltas (the
--   pool's per-minute records, see minutes_add.lua); "quarantine" and a mode (below):
--   "groups", the claiming pool holds no message claimed alone, so it may take a
--   group; "alone", it also has a handler free to start one at once, so it may take a
--   message claimed alone. Without it, the claim takes no quarantined message.
--   "most" and a number of bytes: where the claim reads the envelopes (serial keys), it
--   reads none longer than that: such a message is handed out as its size (a number in
--   envelopes) and taken as due now, for the caller to bury unread.
-- Returns {header, ids, envelopes, later, keyed, repeats, lease} (decoded by
--   scripts/claim.rs):
--   header {now_ms, next_ms, reaped, limited, restart_generation, minute, us_past_ms,
--     quarantined_left}:
--     minute: the current minute (queue clock ms / 60000) when the claim carried the
--     per-minute records, else -1.
--     us_past_ms: the microseconds past now_ms (0..999) of the clock reading.
--     quarantined_left: 1 if a quarantined message was due and not taken (its mode
--     did not allow it, or the claim took another group), else 0.
--     limited: 1 if a rate limit is in force, the queue's or a group's (the caller
--     then claims only for idle handlers, so that a message starts as it is handed
--     out, see limit.lua), else 0.
--     restart_generation: how many requests that running pools stop were made (see
--     restart.lua); a pool that saw a lower one at its start stops gracefully.
--     next_ms: earliest due time or lease deadline still ahead (for due messages the
--     rate limit held back: when its window frees), -1 if none, -2 if the queue is
--     paused; the caller sleeps until then unless a producer publishes an earlier due
--     time.
--   ids {id1, ..., idn}: the n messages claimed.
--   envelopes {envelope1, ..., envelopen} when the claim read them (serial keys need
--     their stamps), else empty: the caller then reads them (see below); past "most",
--     an envelope's size instead.
--   lease {token, j1, lease1, ...}: each delivery's lease, which the caller sends back
--     whole to complete it: the claim's token (absent when nothing was claimed), and
--     after it pairs that name the others, "<token>:<score>" (see include/base.lua):
--     the seed layout's. So the reply carries the token once, not once per message.
--     A stamp gives the due time (include/stamp.lua).
--   later {i1, attempt1, ...}: which of them are on a later attempt; every other one
--     is on its first (nearly all are, so the reply does not repeat it).
--   keyed {j1, key1, ...}: the serial key of the claimed messages pushed with one (see
--     include/serial.lua).
--   repeats {name1, definition1, mark1, ...}: repeating messages whose chain of
--     occurrences broke (none waits or runs: the pool that ran the last one failed to
--     push the next, or purge or cancel took it); the caller computes and pushes their
--     next occurrence (repeat_next.lua). mark: the due time of the latest occurrence,
--     -1 if none.
-- Quarantine: a claim that expires (its pool died, froze or was cut off) charges none
-- of its messages an attempt: which ones its handlers had started, and which one killed
-- the pool, is not known. They go to the quarantine instead (include/quarantine.lua),
-- each allowed a claim half the size of the expired one: a group ("g<token>") of such
-- messages is claimed apart from the others, and halves again if it expires, down to a
-- message claimed alone ("q<token>"), by a pool with a handler free to start it at once
-- and no other such message in hand; so is a claim of a single message for such a
-- pool. Only such a claim's expiry is charged: its handler may have started it, and
-- nothing else ran under it. So a message that kills its worker reaches the dead
-- letters after max_attempts (and a few more deaths, one per halving), and the
-- messages that shared its claims come back with the attempts they had.
-- This script runs once per batch of up to 1000 messages and is the drain's hot path:
-- every per-message step below is one element of a variadic call, and no envelope
-- passes through it unless serial keys need their stamps.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include quarantine
-- @include dead
-- @include forget
-- @include group_gate
-- @include hashtable
-- @include hdel_if_any
-- @include minutes
-- @include oom
-- @include order
-- @include pools
-- @include repeat
-- @include schedule
-- @include seq
-- @include serial
-- @include stall
-- @include restamp
-- @include shown
-- KEYS: scheduled messages inflight leases attempts errors dead stats seq workers paused repeats repeat_marks limit limit_log control traces serial_keys serial_holders serial_line serial_lined minutes claims claim_ids quarantine group_grants
-- The optional sections, read whole before anything is written.
local beat, minutes_kept, minute_deltas, quarantine_mode, most = nil, nil, nil, nil, nil
local at = 8
while ARGV[at] do
  local section = ARGV[at]
  if section == 'beat' then
    beat = {ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3]}
    at = at + 4
  elseif section == 'minutes' then
    minutes_kept = tonumber(ARGV[at + 1])
    local n = tonumber(ARGV[at + 2])
    if not (minutes_kept and minutes_kept >= 1 and n) then
      return redis.error_reply('DQERR malformed minutes section')
    end
    local malformed
    minute_deltas, malformed = read_minute_deltas(ARGV, at + 3, at + 2 + n)
    if not minute_deltas then
      return redis.error_reply('DQERR ' .. malformed)
    end
    at = at + 3 + n
  elseif section == 'most' then
    most = tonumber(ARGV[at + 1])
    if not most then
      return redis.error_reply('DQERR malformed most section')
    end
    at = at + 2
  elseif section == 'quarantine' then
    quarantine_mode = ARGV[at + 1]
    if quarantine_mode ~= 'groups' and quarantine_mode ~= 'alone' then
      return redis.error_reply('DQERR malformed quarantine section')
    end
    at = at + 2
  else
    return redis.error_reply('DQERR unknown claim section ' .. section)
  end
end
if beat and not (beat[1] and beat[2] and beat[3]) then
  return redis.error_reply('DQERR malformed beat section')
end

-- Expired claims reaped per call, each of up to 1000 messages: the calls that follow
-- reap the rest.
local CLAIMS_REAPED = 8
run_even_out_of_memory()
local batch = tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[4])
local now = queue_now(true)
-- A queue that never held a group (its format says so) skips groups' steps.
local holds_groups = (format_stored or 0) >= tonumber(GROUPS_FORMAT)
absorb_stall(now, lease_ms)

-- Expired leases go back to the front of the schedule: the message is due already.
-- A delivery with a deadline of its own (a handler past its timeout) and one claimed
-- alone count as an attempt, with the expiry as its error; the messages of an
-- expired claim of several go to the quarantine uncharged (see above). Claims expire whole (see include/claims.lua).
local expired = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', now, 'LIMIT', 0, batch)
local detached = #expired
-- Whole claims, while fewer than a batch are taken: at most 2000 ids, whose lists of
-- pairs stay within what Lua's unpack takes (8000).
local ended, quarantined, uncharged = {}, {}, {}
for _, token in ipairs(redis.call('ZRANGEBYSCORE', K_CLAIMS, '-inf', now, 'LIMIT', 0, CLAIMS_REAPED)) do
  if #expired >= math.max(batch, 1) then
    break
  end
  local first = #expired + 1
  held_by(token, expired)
  local alone = string.sub(token, 1, 1) == 'q'
  local size = alone and 1 or quarantine_size(#expired - first + 1)
  for i = first, #expired do
    uncharged[i] = not alone
    quarantined[#quarantined + 1] = expired[i]
    quarantined[#quarantined + 1] = size
  end
  ended[#ended + 1] = token
end
-- One marked cancelled while it ran (cancel.lua) is deleted instead, counted under
-- "cancelled": it never runs again.
local envelopes = #expired > 0 and not SEED and redis.call('HMGET', K_MSG, unpack(expired))
local cancelled = {}
if envelopes then
  for i, id in ipairs(expired) do
    if cancel_mark(envelopes[i]) > 0 then
      cancelled[id] = true
      cancelled[#cancelled + 1] = id
    end
  end
  if #cancelled > 0 then
    local left = {}
    for i = 1, #quarantined, 2 do
      if not cancelled[quarantined[i]] then
        left[#left + 1] = quarantined[i]
        left[#left + 1] = quarantined[i + 1]
      end
    end
    quarantined = left
  end
end
if #expired > 0 then
  local readd, counted, errors, charged, score_of = {}, {}, {}, {}, {}
  local before = redis.call('HMGET', K_ATT, unpack(expired))
  for i, id in ipairs(expired) do
    -- One cancelled is deleted below.
    if not cancelled[id] then
      readd[#readd + 1] = fmt(score_at(now))
      readd[#readd + 1] = id
      score_of[id] = readd[#readd - 1]
      if not uncharged[i] then
        local attempt = (tonumber(before[i]) or 0) + 1
        counted[#counted + 1] = id
        counted[#counted + 1] = attempt
        errors[#errors + 1] = id
        errors[#errors + 1] = 'lease expired during attempt ' .. attempt .. ' (worker stopped or hung)'
        charged[#charged + 1] = id
      end
    end
  end
  if envelopes then
    local restamped = {}
    for i, id in ipairs(expired) do
      if envelopes[i] and not cancelled[id] then
        restamped[#restamped + 1] = id
        restamped[#restamped + 1] = stamped(envelopes[i], score_of[id])
      end
    end
    if #restamped > 0 then
      redis.call('HSET', K_MSG, unpack(restamped))
    end
  end
  -- In the schedule before out of the in-flight set: no message is ever in neither.
  if #readd > 0 then
    redis.call('ZADD', K_SCHED, unpack(readd))
  end
  if detached > 0 then
    redis.call('ZREM', K_INFLIGHT, unpack(expired, 1, detached))
  end
  redis.call('HDEL', K_LEASE, unpack(expired))
  if #charged > 0 then
    redis.call('HSET', K_ATT, unpack(counted))
    redis.call('HSET', K_ERR, unpack(errors))
    -- A trace from an earlier attempt would not belong to this error.
    hdel_if_any(K_TRACE, charged)
  end
  if #quarantined > 0 then
    redis.call('HSET', K_QUARANTINE, unpack(quarantined))
  end
  if #expired > #cancelled then
    redis.call('HINCRBY', K_STATS, 'expired', #expired - #cancelled)
  end
  free_serial_keys(expired, nil, nil, now)
  if #cancelled > 0 then
    forget(cancelled)
    redis.call('HINCRBY', K_STATS, 'cancelled', #cancelled)
  end
end
drop_claims(ended)
-- Group grants that left their rate window bring back what they held in line.
if holds_groups then
  expire_group_grants(now)
end

trim_dead(now, tonumber(ARGV[5]), tonumber(ARGV[6]))
if beat then
  register_pool(now, beat[1], beat[2], beat[3])
end

-- Rare (the caller asks about once a minute) and small: one entry per repeat.
local broken = {}
if ARGV[7] == '1' then
  if redis.call('EXISTS', K_QUARANTINE) == 1 then
    sweep_quarantine()
  end
  local all = redis.call('HGETALL', K_REPEATS)
  for i = 1, #all, 2 do
    local mark = tonumber(redis.call('HGET', K_MARKS, all[i]))
    local id = mark and occurrence_id(all[i], mark)
    if not (id and (redis.call('ZSCORE', K_SCHED, id) or redis.call('HGET', K_LEASE, id))) then
      broken[#broken + 1] = all[i]
      broken[#broken + 1] = all[i + 1]
      broken[#broken + 1] = mark or -1
    end
  end
end
local header = {now, -1, #expired, 0, tonumber(redis.call('HGET', K_CONTROL, 'restart_gen')) or 0, -1, queue_now_us, 0}
local claimed_ids, claimed_envelopes, later, keyed, lease_part = {}, {}, {}, {}, {}
-- The per-minute records are written last, when nothing else can fail: a claim that
-- raised leaves them to be sent again, not counted twice.
local function reply()
  -- While a group's rate window holds grants, the pool claims for idle handlers only,
  -- so that its messages start as they are granted, as under the queue's rate limit.
  if holds_groups and redis.call('EXISTS', K_GROUP_GRANTS) == 1 then
    header[4] = 1
  end
  if minute_deltas then
    header[6] = add_minutes(now, minutes_kept, minute_deltas)
  end
  return {header, claimed_ids, claimed_envelopes, later, keyed, broken, lease_part}
end
if redis.call('EXISTS', K_PAUSED) == 1 then
  -- Nothing to wake for: resuming publishes the schedule's head (see pause.lua).
  header[2] = -2
  return reply()
end
-- The rate limit (see limit.lua) caps this claim at what the window has left.
local limit = redis.call('HMGET', K_LIMIT, 'max', 'per', 'used')
local limited_until = nil
if limit[1] then
  header[4] = 1
  local max, per, used = tonumber(limit[1]), tonumber(limit[2]), tonumber(limit[3]) or 0
  -- Grants leave the window `per` ms after they were made; at most 1000 at a time
  -- (the rest count a little longer, which only errs on the side of the limit).
  local old = redis.call('ZRANGEBYSCORE', K_LIMIT_LOG, '-inf', fmt(now - per), 'LIMIT', 0, 1000)
  if #old > 0 then
    for _, grant in ipairs(old) do
      used = used - tonumber(string.match(grant, ':(%d+)$'))
    end
    redis.call('ZREM', K_LIMIT_LOG, unpack(old))
    redis.call('HSET', K_LIMIT, 'used', used)
  end
  if max - used < batch then
    batch = math.max(max - used, 0)
    limited_until = function()
      local oldest = redis.call('ZRANGE', K_LIMIT_LOG, 0, 0, 'WITHSCORES')
      return oldest[2] and tonumber(oldest[2]) + per or now
    end
  end
end
-- The seed layout's bare payloads carry no stamp: there the schedule tells the
-- scores (see include/stamp.lua).
local ids, seed_scores, group, group_kind = {}, nil, nil, nil
if batch > 0 then
  -- Quarantined messages are passed over, but for one group: read past them.
  local quarantine = redis.call('EXISTS', K_QUARANTINE) == 1
  local read = quarantine and batch + math.min(redis.call('HLEN', K_QUARANTINE), 1000) or batch
  -- Where messages have groups (the queue's format says so), a backlog of one group may
  -- stand in front of others' messages: read past it (what its limits hold goes to its
  -- line, once), so that groups take turns (serial_gate, which hands out no more than
  -- the batch).
  if not quarantine and holds_groups and redis.call('EXISTS', K_SERIAL) == 1 then
    read = math.min(math.max(4 * batch, 100), 1000)
  end
  if SEED then
    local due = redis.call('ZRANGEBYSCORE', K_SCHED, '-inf', fmt(due_bound(now)), 'WITHSCORES', 'LIMIT', 0, read)
    seed_scores = {}
    for i = 1, #due / 2 do
      ids[i] = due[2 * i - 1]
      seed_scores[i] = due[2 * i]
    end
  else
    ids = redis.call('ZRANGEBYSCORE', K_SCHED, '-inf', fmt(due_bound(now)), 'LIMIT', 0, read)
  end
  if quarantine and #ids > 0 then
    ids, seed_scores, group, group_kind, header[8] = pass_quarantined(ids, seed_scores, batch, quarantine_mode)
  end
end
local n = #ids
if n > 0 then
  local previous = nil
  if redis.call('EXISTS', K_ATT) == 1 then
    previous = redis.call('HMGET', K_ATT, unpack(ids))
  end
  -- The envelopes are read here only where serial keys need their stamps: passing
  -- them through Lua costs Redis more than the rest of the claim (it hashes every
  -- byte of every string it receives), so otherwise the caller reads them with one
  -- HMGET once it holds the leases (see scripts/claim.rs), and ends the deliveries
  -- of ids that have none (orphans.lua).
  local envelopes, blocked, keys, groups = nil, nil, nil, nil
  if redis.call('EXISTS', K_SERIAL) == 1 then
    groups = group_gate(now, lease_ms)
    envelopes = sized_values(K_MSG, ids, most or WHOLE)
    -- The score each was due at: the schedule's in the seed layout, else its stamp's
    -- (now's for a hand edit without one, or one left unread).
    local scores = seed_scores or {}
    if not seed_scores then
      for i = 1, n do
        local envelope = envelopes[i]
        scores[i] = type(envelope) == 'string' and stamp_score(envelope, now) or due_bound(now)
      end
    end
    blocked, keys = serial_gate(ids, envelopes, scores, now, lease_ms, groups, batch)
  end
  -- Usually every id read is handed out: the list ZRANGEBYSCORE gave is the reply's,
  -- with no copy per message. Ids the serial gate held back (back in the schedule,
  -- see serial_gate) or without an envelope (written by hand or by a foreign tool)
  -- are left out of copies; at[j] is then the read index of the j-th one handed out.
  local taken, orphans, at = ids, {}, nil
  local whole = not (blocked and next(blocked))
  if whole and envelopes then
    for i = 1, n do
      if not envelopes[i] then
        whole = false
        break
      end
    end
  end
  if whole then
    claimed_ids = ids
    claimed_envelopes = envelopes or claimed_envelopes
  else
    taken, at = {}, {}
    for i = 1, n do
      if not blocked[i] then
        taken[#taken + 1] = ids[i]
        if envelopes[i] then
          claimed_ids[#claimed_ids + 1] = ids[i]
          claimed_envelopes[#claimed_ids] = envelopes[i]
          at[#claimed_ids] = i
        else
          orphans[#orphans + 1] = ids[i]
        end
      end
    end
  end
  local claimed = #claimed_ids
  local deadline = fmt(now + lease_ms)
  -- The lease is the claim's token alone but in the seed layout: the reply carries it
  -- once, and the stamp tells the score (see include/stamp.lua).
  local token = fmt(next_seq())
  local token_colon = token .. ':'
  if groups then
    groups.finish(token)
  end
  -- The quarantined group, those of it that the serial gate let through: first in
  -- line (so that a free handler starts one taken alone at once), under a claim of
  -- its own.
  local grouped = 0
  while group and claimed_ids[grouped + 1] and group[claimed_ids[grouped + 1]] do
    grouped = grouped + 1
  end
  -- A single message taken for a free handler is started at once, as one taken alone
  -- from the quarantine is: its expiry counts as an attempt too.
  if grouped == 0 and claimed == 1 and quarantine_mode == 'alone' then
    grouped, group_kind = 1, 'q'
  end
  local leases = {}
  lease_part[1] = token
  for j = 1, claimed do
    local i = at and at[j] or j
    local lease = token
    if seed_scores then
      lease = token_colon .. seed_scores[i]
    end
    if j <= grouped then
      lease = group_kind .. lease
    end
    if lease ~= token then
      lease_part[#lease_part + 1] = j
      lease_part[#lease_part + 1] = lease
    end
    leases[2 * j - 1] = claimed_ids[j]
    leases[2 * j] = lease
    local finished = previous and tonumber(previous[i])
    if finished then
      later[#later + 1] = j
      later[#later + 1] = finished + 1
    end
    if keys and keys[i] then
      keyed[#keyed + 1] = j
      keyed[#keyed + 1] = keys[i]
    end
  end
  if claimed == 0 then
    lease_part[1] = nil
  end
  -- In flight under a lease before out of the schedule: no message is ever in
  -- neither (the ones the serial gate held back stay, at their new score).
  if grouped > 0 then
    local members = {unpack(claimed_ids, 1, grouped)}
    redis.call('ZADD', K_CLAIMS, deadline, group_kind .. token)
    redis.call('HSET', K_CLAIM_IDS, group_kind .. token, cmsgpack.pack(members), group_kind .. token .. '#', grouped)
    -- A single message claimed for a free handler (no group read) has no entry.
    if group then
      redis.call('HDEL', K_QUARANTINE, unpack(members))
    end
  end
  if claimed > grouped then
    redis.call('ZADD', K_CLAIMS, deadline, token)
    redis.call('HSET', K_CLAIM_IDS, token, cmsgpack.pack(grouped > 0 and {unpack(claimed_ids, grouped + 1)} or claimed_ids),
      token .. '#', claimed - grouped)
  end
  if claimed > 0 then
    hset_as_hashtable(K_LEASE, leases)
  end
  if #taken > 0 then
    redis.call('ZREM', K_SCHED, unpack(taken))
  end
  if claimed > 0 then
    redis.call('HINCRBY', K_STATS, 'delivered', claimed)
    if limit[1] then
      redis.call('ZADD', K_LIMIT_LOG, now, token_colon .. claimed)
      redis.call('HINCRBY', K_LIMIT, 'used', claimed)
    end
  end
  if #orphans > 0 then
    forget(orphans)
    redis.call('HINCRBY', K_STATS, 'orphaned', #orphans)
  end
end

-- The next moment worth waking for: the schedule's head, the next lease to expire, or
-- the next group grant to leave its window (what it held in line is then due).
local next_ms = -1
local head = head_score()
if head then
  next_ms = due_of(head)
  -- Due messages the limit held back wait for the window to free.
  if limited_until and next_ms <= now then
    next_ms = limited_until()
  end
end
for _, key in ipairs(holds_groups and {K_CLAIMS, K_INFLIGHT, K_GROUP_GRANTS} or {K_CLAIMS, K_INFLIGHT}) do
  local lease_head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if lease_head[2] then
    local expiry = tonumber(lease_head[2])
    if next_ms < 0 or expiry < next_ms then
      next_ms = expiry
    end
  end
end
header[2] = next_ms
return reply()
