-- ack.lua: complete deliveries; only the delivery holding the lease may do so
-- (fencing: a worker whose lease expired cannot complete the re-delivery).
-- ARGV[3] completed messages to keep (0: none)   ARGV[4] for how long (ms)
-- ARGV[5..] runs of deliveries holding one lease (as claim returned it): the lease,
--   how many ids follow, the ids. A claim's messages share its lease, so the ids of a
--   pool's batch mostly come in one run.
-- Returns the number of deliveries when every one was acked, else one status per
--   delivery, in the order sent: 1 acked, 0 lease lost (the message lives on under
--   another delivery), -1 gone (already completed, cancelled or purged), 3 cancelled
--   (marked while it ran, see cancel.lua: deleted, counted under "cancelled", not
--   kept as completed).
-- Marks are looked for while the latest is recent (control's cancel_ms, see
-- cancel.lua, within two leases as stall_ms tells them): a pool that learned of a
-- mark at a heartbeat fails its delivery instead, which nack.lua ends as cancelled.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include completed
-- @include forget
-- @include oom
-- @include serial
-- @include stall
-- @include stamp
-- KEYS: scheduled messages inflight leases attempts errors stats control completed completed_messages traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
-- The runs, read whole before anything is written, so that a malformed one writes
-- nothing: {lease, first, last, lost}, where first..last are the ARGV indexes of its
-- ids and lost[i] is true for its i-th id if that delivery no longer holds the lease.
local runs, total, any_lost = {}, 0, false
local at = 5
while ARGV[at] do
  local lease, count = ARGV[at], tonumber(ARGV[at + 1])
  local first, last = at + 2, at + 1 + (count or 0)
  if not (count and count >= 1 and ARGV[last]) then
    return redis.error_reply('DQERR malformed ack run at argument ' .. at)
  end
  -- Whole-run reads: a fixed number of calls per batch, and per message only a
  -- comparison (no C call, no table of the ids: they stay in ARGV).
  local held = redis.call('HMGET', K_LEASE, unpack(ARGV, first, last))
  local lost = {}
  for i = 1, count do
    if held[i] ~= lease then
      lost[i] = true
      any_lost = true
    end
  end
  runs[#runs + 1] = {lease, first, last, lost}
  total = total + count
  at = last + 1
end

run_even_out_of_memory()
local now = queue_now(true)
local cancel_ms, stall_ms = absorb_stall(now)
local keep = tonumber(ARGV[3])

-- The acknowledged ones: done[first..last], each holding leases[i] (nil: all the
-- first run's lease). The usual batch, one claim's deliveries all still held, is
-- ARGV's range itself.
local result, done, leases, first, last = total, ARGV, nil, 5, 4
-- Where each acknowledged one answers in a reply of one status per delivery.
local each, done_at = nil, nil
if #runs == 1 and not any_lost then
  first, last = runs[1][2], runs[1][3]
elseif #runs > 0 then
  done, leases, first, last = {}, {}, 1, 0
  local others, other_at = {}, {}
  each, done_at = {}, {}
  for _, run in ipairs(runs) do
    local lease, lost = run[1], run[4]
    for i = run[2], run[3] do
      if lost[i - run[2] + 1] then
        others[#others + 1] = ARGV[i]
        other_at[#others] = #each + 1
        each[#each + 1] = 0
      else
        last = last + 1
        done[last], leases[last] = ARGV[i], lease
        each[#each + 1] = 1
        done_at[last] = #each
      end
    end
  end
  if any_lost then
    local alive = redis.call('HMGET', K_MSG, unpack(others))
    for j = 1, #others do
      each[other_at[j]] = alive[j] and 0 or -1
    end
    result = each
  end
end
local n_done = last - first + 1
local cancel_ids, cancel_leases = {}, {}
if n_done > 0 and not SEED and cancel_ms and now - cancel_ms <= 4 * (stall_ms or 30000) then
  local envelopes = redis.call('HMGET', K_MSG, unpack(done, first, last))
  local kept, kept_leases = {}, {}
  for i = 1, n_done do
    local lease = leases and leases[first + i - 1] or runs[1][1]
    if cancel_mark(envelopes[i]) > 0 then
      if not each then
        each = {}
        for j = 1, total do
          each[j] = 1
        end
      end
      each[done_at and done_at[first + i - 1] or i] = 3
      cancel_ids[#cancel_ids + 1] = done[first + i - 1]
      cancel_leases[#cancel_leases + 1] = lease
    else
      kept[#kept + 1] = done[first + i - 1]
      kept_leases[#kept_leases + 1] = lease
    end
  end
  if #cancel_ids > 0 then
    result = each
    done, leases, first, last = kept, kept_leases, 1, #kept
    n_done = #kept
  end
end
if n_done > 0 and keep > 0 then
  -- Kept as they were at their end: envelope, attempts, the due time they ran for.
  local ids = {unpack(done, first, last)}
  local envelopes = redis.call('HMGET', K_MSG, unpack(ids))
  local now_text = fmt(now)
  local finished = redis.call('HMGET', K_ATT, unpack(ids))
  local when, records = {}, {}
  for i = 1, n_done do
    local score = lease_score(leases and leases[i] or runs[1][1]) or stamp_score(envelopes[i], now)
    when[2 * i - 1], when[2 * i] = now_text, ids[i]
    records[2 * i - 1] = ids[i]
    records[2 * i] = fmt((tonumber(finished[i]) or 0) + 1) .. '|' .. fmt(score and due_of(score) or -1) .. '|'
      .. (envelopes[i] or '')
  end
  redis.call('ZADD', K_DONE, unpack(when))
  redis.call('HSET', K_DONE_MSG, unpack(records))
  trim_completed(now, keep, tonumber(ARGV[4]))
elseif redis.call('EXISTS', K_DONE) == 1 then
  trim_completed(now, keep, tonumber(ARGV[4]))
end
if n_done > 0 then
  free_serial_keys(done, first, last, now)
  forget(done, first, last)
  -- Last: an error before it leaves a claim counting too many, which its reaper
  -- clears, never a lease without its claim.
  if leases then
    leave_claims(leases, n_done, done)
  else
    leave_claim(runs[1][1], done, first, last)
  end
  redis.call('HINCRBY', K_STATS, 'acked', n_done)
end
if #cancel_ids > 0 then
  free_serial_keys(cancel_ids, nil, nil, now)
  forget(cancel_ids)
  leave_claims(cancel_leases, #cancel_ids, cancel_ids)
  redis.call('HINCRBY', K_STATS, 'cancelled', #cancel_ids)
end
return result
