-- extend.lua: heartbeat: push the lease deadline of running deliveries forward, and
-- detach those whose handlers ran past their timeout from their claims.
-- ARGV[3] lease_ms   ARGV[4] n: how many pairs to detach   ARGV[5..] n pairs to detach,
--   then pairs to extend: id, lease (as claim returned it).
-- Returns one status per pair, in order: 1 detached or extended; 0 lease lost
--   (another delivery holds the message, or its lease expired and it waits to be
--   delivered again); -1 the message is gone (its completion was written while the
--   heartbeat was on its way: no loss); 3 detached or extended, and cancelled while
--   it runs (cancel.lua); 4 the same, and its process is to be killed.
-- Marks are looked for while the latest is recent (control's cancel_ms, within two
-- leases): a live pool beats every lease / 3, so each sees a mark in that time.
-- A claim's messages share its deadline (include/claims.lua), so a heartbeat for any
-- of them renews all; a detached one keeps the deadline it had (see detach), and
-- expires then unless its handler completes it first.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include claims
-- @include clock
-- @include oom
-- @include stall
-- @include stamp
-- KEYS: messages inflight leases stats control claims claim_ids
run_even_out_of_memory()
local now = queue_now(true)
local cancel_ms = absorb_stall(now, tonumber(ARGV[3]))
local deadline = now + tonumber(ARGV[3])
local first_extended = 5 + 2 * tonumber(ARGV[4])
-- Checked only while some delivery has a deadline of its own.
local own = redis.call('EXISTS', K_INFLIGHT) == 1
local marks = cancel_ms and now - cancel_ms <= 2 * tonumber(ARGV[3])
local result, claims = {}, {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local lease = redis.call('HGET', K_LEASE, id)
  if lease == token then
    if i < first_extended then
      detach(id, lease)
    elseif own and redis.call('ZSCORE', K_INFLIGHT, id) then
      -- Detached: its deadline stays its own (see detach), whatever asks.
    else
      claims[claim_token(lease)] = true
    end
    local mark = marks and cancel_mark(redis.call('HGET', K_MSG, id)) or 0
    result[#result + 1] = mark > 0 and mark + 2 or 1
  elseif lease or redis.call('HEXISTS', K_MSG, id) == 1 then
    result[#result + 1] = 0
  else
    result[#result + 1] = -1
  end
end
-- One deadline per claim.
for token in pairs(claims) do
  redis.call('ZADD', K_CLAIMS, 'XX', deadline, token)
end
return result
