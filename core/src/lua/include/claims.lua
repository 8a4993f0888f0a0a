-- claims.lua: a lease per claim. The messages of one claim share one entry in
-- K_CLAIMS, the claim's token scored by its deadline (a heartbeat moves it), and one
-- record in K_CLAIM_IDS: "<token>" -> its ids (cmsgpack, so any id fits), "<token>#" ->
-- how many of them it still holds. Each message's lease (K_LEASE) names its claim's
-- token, so a completion is fenced per message as before. A message that leaves its
-- claim (acknowledged, failed, released) lowers the count, and a claim that holds
-- nothing is deleted; an expired claim's record tells the reaper which messages to
-- deliver again: those whose lease still names it. So a claim writes two entries
-- whatever its size, where a deadline per message cost a ZSET entry each way.
-- A delivery with a deadline of its own in K_INFLIGHT counts in no claim: its
-- handler ran past its timeout, and its pool detached it (see detach below). The
-- reaper, the serial gate and the views read both.

-- The claim token of a lease ("<token>" or "<token>:<score>", see include/base.lua).
local function claim_token(lease)
  return string.match(lease, '^[^:]+')
end

-- `n` messages left the claim `token`: a claim that holds nothing is deleted.
local function lower_count(token, n)
  if redis.call('HINCRBY', K_CLAIM_IDS, token .. '#', -n) <= 0 then
    redis.call('HDEL', K_CLAIM_IDS, token, token .. '#')
    redis.call('ZREM', K_CLAIMS, token)
  end
end

-- The messages ids[1..n], holding leases[1..n], left their deliveries: each lowers
-- its claim's count, or leaves K_INFLIGHT if it had a deadline of its own.
local function leave_claims(leases, n, ids)
  local own = {}
  if redis.call('EXISTS', K_INFLIGHT) == 1 then
    local gone = {}
    for i = 1, n do
      if redis.call('ZSCORE', K_INFLIGHT, ids[i]) then
        own[i] = true
        gone[#gone + 1] = ids[i]
      end
    end
    if #gone > 0 then
      redis.call('ZREM', K_INFLIGHT, unpack(gone))
    end
  end
  local counts, token_of = {}, {}
  for i = 1, n do
    if not own[i] then
      local lease = leases[i]
      local token = token_of[lease]
      if not token then
        token = claim_token(lease)
        token_of[lease] = token
      end
      counts[token] = (counts[token] or 0) + 1
    end
  end
  for token, count in pairs(counts) do
    lower_count(token, count)
  end
end

-- The messages list[first..last], all holding `lease`, left their deliveries.
local function leave_claim(lease, list, first, last)
  if redis.call('EXISTS', K_INFLIGHT) == 1 then
    local ids, leases = {}, {}
    for i = first, last do
      ids[#ids + 1] = list[i]
      leases[#leases + 1] = lease
    end
    return leave_claims(leases, #ids, ids)
  end
  lower_count(claim_token(lease), last - first + 1)
end

-- The delivery of `id` under `lease` (checked by the caller), whose handler ran past
-- its timeout, leaves its claim for a deadline of its own: the claim's current one,
-- which no heartbeat renews. So it expires then, while the claim's other messages,
-- whose handlers live, keep theirs; the late handler can still complete it until then.
local function detach(id, lease)
  if redis.call('ZSCORE', K_INFLIGHT, id) then
    return
  end
  local token = claim_token(lease)
  -- No claim holds it (none should be missing): due for the reaper now.
  local deadline = redis.call('ZSCORE', K_CLAIMS, token) or '0'
  redis.call('ZADD', K_INFLIGHT, deadline, id)
  lower_count(token, 1)
end

-- The lease deadline (ms) of a running message, nil if it does not run.
local function lease_deadline(id)
  local own = redis.call('ZSCORE', K_INFLIGHT, id)
  if own then
    return tonumber(own)
  end
  local lease = redis.call('HGET', K_LEASE, id)
  return lease and tonumber(redis.call('ZSCORE', K_CLAIMS, claim_token(lease)))
end

-- The ids an expired claim still held (none detached), appended to `out`.
local function held_by(token, out)
  local packed = redis.call('HGET', K_CLAIM_IDS, token)
  if not packed then
    return
  end
  local ids = cmsgpack.unpack(packed)
  local leases = redis.call('HMGET', K_LEASE, unpack(ids))
  local detached = redis.call('EXISTS', K_INFLIGHT) == 1
  for i = 1, #ids do
    if leases[i] and claim_token(leases[i]) == token
      and not (detached and redis.call('ZSCORE', K_INFLIGHT, ids[i])) then
      out[#out + 1] = ids[i]
    end
  end
end

-- Delete claims (their entry and record).
local function drop_claims(tokens)
  if #tokens == 0 then
    return
  end
  local fields = {}
  for i = 1, #tokens do
    fields[2 * i - 1] = tokens[i]
    fields[2 * i] = tokens[i] .. '#'
  end
  redis.call('ZREM', K_CLAIMS, unpack(tokens))
  redis.call('HDEL', K_CLAIM_IDS, unpack(fields))
end
