-- push_runs.lua: the work of push.lua and push_replace.lua (see push.lua for the
-- arguments and the reply). `replacing` is nil for a push without a "replace" run,
-- which then touches only the schedule, the messages, the serial keys, the stats, the
-- sequence and the clock: push.lua takes those 6 keys, and its preflight checks them
-- and its commands alone, where a replace needs 17; or, for push_replace.lua,
-- {replaceable = f(id), forget = f(ids, n)} from include/replace.lua.
-- @include clock
-- @include order
-- @include schedule
-- @include restamp
local function push_runs(replacing)
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
    if not replacing and string.find(options, 'replace', 1, true) then
      return redis.error_reply('DQERR malformed push run at argument ' .. (first - 4)
        .. ': "replace" is push_replace.lua\'s')
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
  local existing, seen = {}, {}
  if check and count > 0 then
    -- One read for the whole batch (HMGET: there is no variadic HEXISTS).
    existing = redis.call('HMGET', K_MSG, unpack(ids))
  end
  -- Whether an existing message may be replaced: it waits, or it is dead (then it
  -- leaves the dead-letter set); a running one is not touched.
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
      stamp = not SEED and (STAMP_OPEN .. '0,' .. word .. '],')
      if sent then
        -- Kept where the push gives the score it proposes: it is the stamp written.
        if score == sent[1] then
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
        stamp = not SEED and (STAMP_OPEN .. '0,' .. word .. '],')
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
      elseif not (check and existing[i]) or (replace and replacing.replaceable(id)) then
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
    replacing.forget(replaced, n_replaced)
  end
  local created = n_adds / 2 - n_replaced
  if n_adds > 0 then
    if any_serial then
      -- A group (include/serial.lua) is what builds of format 1 would misread.
      for _, serial in pairs(serial_of) do
        if string.byte(serial, 1) == 1 then
          record_format(GROUPS_FORMAT)
          break
        end
      end
    end
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
end
