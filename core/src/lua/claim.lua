-- claim.lua: hand up to ARGV[3] due messages to one consumer under a lease, after
-- re-scheduling deliveries whose lease expired (their worker died or hung).
-- KEYS: see lib.lua.
-- ARGV[3] batch (1..1000)   ARGV[4] lease_ms   ARGV[5] dead_max   ARGV[6] dead_ttl_ms
-- Returns {now_ms, next_ms, reaped, id1, token1, due_ms1, attempt1, envelope1, ...}
--   next_ms: earliest due time or lease deadline still ahead, -1 if none; the caller
--   sleeps until then unless a producer publishes an earlier due time.
local batch = tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[4])
local now = now_ms()

-- Expired leases go back to the front of the schedule: the message is due already.
local expired = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', now, 'LIMIT', 0, batch)
if #expired > 0 then
  local readd = {}
  local seq = next_seq(#expired)
  for i, id in ipairs(expired) do
    readd[#readd + 1] = score_of(now, seq - #expired + i)
    readd[#readd + 1] = id
    local att = redis.call('HGET', K_ATT, id) or '0'
    redis.call('HSET', K_ERR, id, 'lease expired during attempt ' .. att .. ' (worker stopped or hung)')
  end
  redis.call('ZREM', K_INFLIGHT, unpack(expired))
  redis.call('HDEL', K_LEASE, unpack(expired))
  redis.call('ZADD', K_SCHED, unpack(readd))
  redis.call('HINCRBY', K_STATS, 'expired', #expired)
end

trim_dead(now, tonumber(ARGV[5]), tonumber(ARGV[6]))

local result = {now, -1, #expired}
local due = redis.call('ZRANGEBYSCORE', K_SCHED, '-inf', fmt(due_bound(now)), 'WITHSCORES', 'LIMIT', 0, batch)
local n = #due / 2
if n > 0 then
  local ids, leases, deadlines = {}, {}, {}
  local deadline = now + lease_ms
  local token_base = next_seq(n) - n
  for i = 1, n do
    local id = due[2 * i - 1]
    ids[i] = id
    deadlines[#deadlines + 1] = deadline
    deadlines[#deadlines + 1] = id
  end
  redis.call('ZREM', K_SCHED, unpack(ids))
  -- Whole-batch reads and writes: a fixed number of calls per batch, not per message.
  local envelopes = redis.call('HMGET', K_MSG, unpack(ids))
  local previous = redis.call('HMGET', K_ATT, unpack(ids))
  local attempts = {}
  local orphans = {}
  local claimed = 0
  for i = 1, n do
    local id = ids[i]
    if envelopes[i] then
      local token = fmt(token_base + i)
      local due_ms = fmt(due_of(tonumber(due[2 * i])))
      leases[#leases + 1] = id
      leases[#leases + 1] = token .. ':' .. due_ms
      local attempt = tonumber(previous[i] or '0') + 1
      attempts[#attempts + 1] = id
      attempts[#attempts + 1] = attempt
      result[#result + 1] = id
      result[#result + 1] = token
      result[#result + 1] = due_ms
      result[#result + 1] = attempt
      result[#result + 1] = envelopes[i]
      claimed = claimed + 1
    else
      -- A scheduled id without an envelope was written by hand or by a foreign tool.
      orphans[#orphans + 1] = id
    end
  end
  if claimed > 0 then
    -- Orphans get a deadline here too and are removed right after: one variadic ZADD.
    redis.call('ZADD', K_INFLIGHT, unpack(deadlines))
    redis.call('HSET', K_LEASE, unpack(leases))
    redis.call('HSET', K_ATT, unpack(attempts))
    redis.call('HINCRBY', K_STATS, 'delivered', claimed)
  end
  if #orphans > 0 then
    redis.call('ZREM', K_INFLIGHT, unpack(orphans))
    forget(orphans)
    redis.call('HINCRBY', K_STATS, 'orphaned', #orphans)
  end
end

-- The next moment worth waking for: the schedule's head or the next lease to expire.
local next_ms = -1
local head = head_score()
if head then
  next_ms = due_of(head)
end
local lease_head = redis.call('ZRANGE', K_INFLIGHT, 0, 0, 'WITHSCORES')
if lease_head[2] then
  local expiry = tonumber(lease_head[2])
  if next_ms < 0 or expiry < next_ms then
    next_ms = expiry
  end
end
result[2] = next_ms
return result
