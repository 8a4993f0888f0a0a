-- stall.lua: leases are deadlines on the Redis clock, renewed by their holders every
-- lease / 3. When no pool script ran for longer than half a lease (Redis stood still:
-- DEBUG SLEEP, CLIENT PAUSE, a long fork; or its clock stepped forward), a holder may
-- have had no chance to renew: every lease that would end within one heartbeat gets
-- that heartbeat, before a claim may reap it, and live holders renew in it. A pool
-- that died is then re-delivered one heartbeat later than without the gap: a pool
-- that only idles (claims at most every idle_check, or at the next lease deadline)
-- leaves gaps too, and granting the whole gap would postpone a dead pool's leases
-- for ever.
-- Returns, read in the same call, the time of the latest cancel mark (control's
-- cancel_ms, see cancel.lua; nil for none) and half a lease (stall_ms, nil if unknown).
local GRACE_STEP = 1000
local function absorb_stall(now, lease_ms)
  local seen = redis.call('HMGET', K_CONTROL, 'seen_ms', 'stall_ms', 'cancel_ms')
  local last, stall_ms, cancel_ms = tonumber(seen[1]), tonumber(seen[2]), tonumber(seen[3])
  if lease_ms then
    stall_ms = math.floor(lease_ms / 2)
    redis.call('HSET', K_CONTROL, 'seen_ms', fmt(now), 'stall_ms', fmt(stall_ms))
  else
    redis.call('HSET', K_CONTROL, 'seen_ms', fmt(now))
  end
  if not (last and stall_ms and now - last > stall_ms) then
    return cancel_ms, stall_ms
  end
  local grace = now + math.floor(stall_ms * 2 / 3)
  -- Claims (include/claims.lua), and detached deliveries one by one.
  for _, key in ipairs({K_CLAIMS, K_INFLIGHT}) do
    while true do
      local ending = redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. fmt(grace), 'LIMIT', 0, GRACE_STEP)
      if #ending == 0 then
        break
      end
      local moved = {}
      for i = 1, #ending do
        moved[2 * i - 1] = fmt(grace)
        moved[2 * i] = ending[i]
      end
      redis.call('ZADD', key, unpack(moved))
    end
  end
  return cancel_ms, stall_ms
end
