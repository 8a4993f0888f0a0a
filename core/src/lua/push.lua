-- push.lua: schedule one or many messages in one call; idempotent per id.
-- ARGV[3] "check": an id may exist already (the caller chose it, or this is a resend
--   of a call that may have run), so each is looked up and an existing one is left
--   as it is; "new": every id is one that delayq generated for this send, so none can
--   exist and the lookup is skipped.
-- ARGV[4..] runs of messages that share their timing and options (written by
--   scripts/push.rs), so that a batch pushed alike costs two words a message: a run is
--   n; "delay" (ms from the server clock) or "at" (Unix time in ms); the ms; options,
--   words of: "replace" (a message of that id that waits or is dead is replaced: new
--   envelope and due time, attempts and last error reset; one that runs is left as it
--   is), "expires" (the envelopes have an expiry, whose deadline counts from the due
--   time), "keyed" (each message has a serial key, see serial_gate in
--   include/serial.lua), "ordered" (the run's ids increase in push order: the run
--   takes one place in its millisecond, see include/order.lua, and Redis orders its
--   messages by id; one score formatted once, where a number per message would be
--   formatted by every ZADD argument), "stamped" (with "ordered" and "at", without
--   "replace" and "expires": the client stamped the envelopes alike,
--   {"at":[0,<score>],..., a score in the run's millisecond: kept as sent by a "new"
--   call when it is the one the run gets, so that Redis builds no string a message;
--   claim no 0, as no claim can have held an id made for this push); then n
--   messages: id, envelope (native: without its opening brace,
--   which the script writes with the stamp, see include/stamp.lua; whole when
--   "stamped"), and with "keyed" the key.
-- Returns {now_ms, created, replaced}: how many messages were new, how many replaced
--   (the others existed already and were left).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include clock
-- @include hdel_if_any
-- @include order
-- @include schedule
-- @include serial
-- @include restamp
-- KEYS: scheduled messages inflight leases attempts errors dead stats seq control traces serial_keys serial_holders serial_line serial_lined claims claim_ids
local check = ARGV[3] == 'check'
local n_argv = #ARGV
-- The runs, read whole before anything is written (the queue clock's read writes it):
-- {first word, n, ms, options, width, whether ms is a delay}.
local runs, n_runs, ids, count = {}, 0, {}, 0
local at = 4
while at <= n_argv do
  local n, ms, options = tonumber(ARGV[at]), tonumber(ARGV[at + 2]), ARGV[at + 3]
  local timing = ARGV[at + 1]
  if not (n and n >= 1 and n == math.floor(n) and ms and options and (timing == 'delay' or timing == 'at')) then
    return redis.error_reply('DQERR malformed push run at argument ' .. at)
  end
  local width = 2
  if string.find(options, 'keyed', 1, true) then
    width = 3
  end
  local first = at + 4
  at = first + n * width
  if at - 1 > n_argv then
    return redis.error_reply('DQERR malformed push run at argument ' .. (first - 4))
  end
  -- A client's stamp, read from the run's first envelope and found at the front of
  -- its last: {score, its length}. Not looked for in the others: a search costs
  -- about as much as the string it saves, and the core writes every one alike.
  local sent = nil
  if string.find(options, 'stamped', 1, true) then
    local digits = string.match(ARGV[first + 1], '^{"at":%[0,(%d+)%],')
    local score = tonumber(digits)
    local fits = not SEED and timing == 'at' and score and fmt(score) == digits and due_of(score) == ms
      and string.find(options, 'ordered', 1, true)
      and not (string.find(options, 'replace', 1, true) or string.find(options, 'expires', 1, true))
    if fits then
      local prefix = STAMP_OPEN .. '0,' .. digits .. '],'
      fits = string.find(ARGV[first + (n - 1) * width + 1], prefix, 1, true) == 1
      sent = {score, #prefix}
    end
    if not fits then
      return redis.error_reply('DQERR malformed push run at argument ' .. (first - 4)
        .. ': "stamped" needs "ordered", "at", neither "replace" nor "expires", and envelopes'
        .. ' that start with one stamp in its millisecond')
    end
  end
  n_runs = n_runs + 1
  runs[n_runs] = {first, n, ms, options, width, timing == 'delay', sent}
  if check then
    for i = first, at - 1, width do
      count = count + 1
      ids[count] = ARGV[i]
    end
  end
end
local now = queue_now(true)
local old_head = head_score()
local claim_no = not SEED and claim_number()
local existing, seen = {}, {}
if check and count > 0 then
  -- One read for the whole batch (HMGET: there is no variadic HEXISTS).
  existing = redis.call('HMGET', K_MSG, unpack(ids))
end
-- Whether an existing message may be replaced: it waits, or it is dead (then it
-- leaves the dead-letter set); a running one is not touched.
local function replaceable(id)
  if redis.call('ZSCORE', K_SCHED, id) then
    return true
  end
  return redis.call('ZREM', K_DEAD, id) == 1
end

-- Counters rather than the # operator, which costs a search of the table per use.
local adds, envelopes, n_adds, lowest = {}, {}, 0, nil
local replaced, n_replaced = {}, 0
-- The serial key of each keyed message written (a replacing push sets its own, or
-- none: "").
local serial_of, any_serial = {}, false
local i = 0
for r = 1, n_runs do
  local first, n, due, options, width, delayed, sent = unpack(runs[r])
  if delayed then
    due = now + due
  end
  -- Where the body starts after a client's stamp that is not kept.
  local body_at = nil
  local replace, expiring, ordered = false, false, false
  if options ~= '' then
    replace = string.find(options, 'replace', 1, true) ~= nil
    expiring = string.find(options, 'expires', 1, true) ~= nil
    ordered = string.find(options, 'ordered', 1, true) ~= nil
  end
  local keyed = width == 3
  local score, word, stamp
  if ordered then
    score = score_at(due)
    word = fmt(score)
    stamp = claim_no and (STAMP_OPEN .. claim_no .. ',' .. word .. '],')
    if sent then
      -- Kept on a first send only: a resend may find the id's first message gone
      -- after a claim held it, so it takes the sequence as it is now.
      if score == sent[1] and not check then
        stamp = nil
      else
        -- Others wait at that millisecond: the run takes another place.
        body_at = sent[2] + 1
      end
    end
  end
  for base = first, first + (n - 1) * width, width do
    i = i + 1
    local id = ARGV[base]
    local envelope = ARGV[base + 1]
    local serial = keyed and ARGV[base + 2] or ''
    if not ordered then
      score = score_at(due)
      -- Formatted here, once for the stamp and the ZADD.
      word = SEED and score or fmt(score)
      stamp = claim_no and (STAMP_OPEN .. claim_no .. ',' .. word .. '],')
    end
    if body_at then
      envelope = stamp .. string.sub(envelope, body_at)
    elseif stamp then
      -- The body comes without its opening brace: one new string a message.
      envelope = stamp .. envelope
    end
    if expiring then
      envelope = with_deadline(envelope, due)
    end
    local earlier = seen[id]
    if earlier then
      -- The same id earlier in this batch: a replacing push takes its place.
      if replace then
        adds[earlier] = word
        envelopes[earlier + 1] = envelope
        if serial ~= '' or serial_of[id] then
          serial_of[id] = serial
          any_serial = any_serial or serial ~= ''
        end
        if score < lowest then
          lowest = score
        end
      end
    elseif not (check and existing[i]) or (replace and replaceable(id)) then
      if check and existing[i] then
        n_replaced = n_replaced + 1
        replaced[n_replaced] = id
      end
      if lowest == nil or score < lowest then
        lowest = score
      end
      adds[n_adds + 1] = word
      adds[n_adds + 2] = id
      envelopes[n_adds + 1] = id
      envelopes[n_adds + 2] = envelope
      if serial ~= '' then
        serial_of[id] = serial
        any_serial = true
      end
      if check then
        seen[id] = n_adds + 1
      end
      n_adds = n_adds + 2
    end
  end
end
if n_replaced > 0 then
  -- A replaced message starts afresh.
  hdel_if_any(K_ATT, replaced)
  hdel_if_any(K_ERR, replaced)
  hdel_if_any(K_TRACE, replaced)
  -- Its new due time stands, and its key is the one it was pushed with now.
  unline(replaced)
  hdel_if_any(K_SERIAL, replaced)
  redis.call('HINCRBY', K_STATS, 'replaced', n_replaced)
end
local created = n_adds / 2 - n_replaced
if n_adds > 0 then
  redis.call('HSET', K_MSG, unpack(envelopes))
  redis.call('ZADD', K_SCHED, unpack(adds))
  if any_serial then
    -- What the batch's last push of each id says: a replacing push of an id earlier in
    -- the batch may have dropped the key, and HSET takes no empty list.
    local keyed, n_keyed = {}, 0
    for id, serial in pairs(serial_of) do
      if serial ~= '' then
        keyed[n_keyed + 1], keyed[n_keyed + 2], n_keyed = id, serial, n_keyed + 2
      end
    end
    if n_keyed > 0 then
      redis.call('HSET', K_SERIAL, unpack(keyed))
    end
  end
  if created > 0 then
    redis.call('HINCRBY', K_STATS, 'pushed', created)
  end
  -- The lowest new score is the new head when it beats the old one: no second read.
  wake_if_earlier(old_head, lowest)
end
return {now, created, n_replaced}
