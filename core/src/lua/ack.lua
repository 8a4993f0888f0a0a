-- ack.lua: complete deliveries; only the delivery holding the lease may do so
-- (fencing: a worker whose lease expired cannot complete the re-delivery).
-- ARGV[3] completed messages to keep (0: none)   ARGV[4] for how long (ms)
-- ARGV[5..] pairs: id, lease (as claim returned it).
-- Returns one status per pair: 1 acked, 0 lease lost (the message lives on under
--   another delivery), -1 gone (already completed, cancelled or purged).
-- Counters rather than the # operator, which costs a search of the table per use.
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
-- KEYS: scheduled messages inflight leases attempts errors stats control completed completed_messages traces serial_keys serial_holders serial_line serial_lined claims claim_ids
run_even_out_of_memory()
local now = queue_now(true)
absorb_stall(now)
local keep = tonumber(ARGV[3])
local ids, tokens, n = {}, {}, 0
for i = 5, #ARGV, 2 do
  n = n + 1
  ids[n] = ARGV[i]
  tokens[n] = ARGV[i + 1]
end
-- Whole-batch reads and writes: a fixed number of calls per batch, not per message.
local leases = redis.call('HMGET', K_LEASE, unpack(ids))
local result, done, tokens_done, others, other_at = {}, {}, {}, {}, {}
local n_done, n_others = 0, 0
for i = 1, n do
  if leases[i] == tokens[i] then
    n_done = n_done + 1
    done[n_done] = ids[i]
    tokens_done[n_done] = tokens[i]
    result[i] = 1
  else
    n_others = n_others + 1
    others[n_others] = ids[i]
    other_at[n_others] = i
  end
end
if n_others > 0 then
  local alive = redis.call('HMGET', K_MSG, unpack(others))
  for j = 1, n_others do
    result[other_at[j]] = alive[j] and 0 or -1
  end
end
if n_done > 0 and keep > 0 then
  -- Kept as they were at their end: envelope, attempts, the due time they ran for.
  local envelopes = redis.call('HMGET', K_MSG, unpack(done))
  local now_text = fmt(now)
  local finished = redis.call('HMGET', K_ATT, unpack(done))
  local at, records = {}, {}
  for i = 1, n_done do
    local score = lease_score(tokens_done[i])
      or stamp_score(envelopes[i], now)
    at[2 * i - 1], at[2 * i] = now_text, done[i]
    records[2 * i - 1] = done[i]
    records[2 * i] = fmt((tonumber(finished[i]) or 0) + 1) .. '|' .. fmt(score and due_of(score) or -1) .. '|'
      .. (envelopes[i] or '')
  end
  redis.call('ZADD', K_DONE, unpack(at))
  redis.call('HSET', K_DONE_MSG, unpack(records))
  trim_completed(now, keep, tonumber(ARGV[4]))
elseif redis.call('EXISTS', K_DONE) == 1 then
  trim_completed(now, keep, tonumber(ARGV[4]))
end
if n_done > 0 then
  free_serial_keys(done)
  forget(done)
  -- Last: an error before it leaves a claim counting too many, which its reaper
  -- clears, never a lease without its claim.
  leave_claims(tokens_done, n_done, done)
  redis.call('HINCRBY', K_STATS, 'acked', n_done)
end
return result
