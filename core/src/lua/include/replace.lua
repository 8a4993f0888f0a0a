-- replace.lua: what push_replace.lua adds to push_runs (include/push_runs.lua).
-- @include hdel_if_any
-- @include serial
local REPLACING = {
  -- Whether an existing message may be replaced: it waits, or it is dead (then it
  -- leaves the dead-letter set); a running one is not touched.
  replaceable = function(id)
    if redis.call('ZSCORE', K_SCHED, id) then
      return true
    end
    return redis.call('ZREM', K_DEAD, id) == 1
  end,
  -- The n ids replaced start afresh: their new due time stands, and their key is the
  -- one they were pushed with now.
  forget = function(replaced, n)
    hdel_if_any(K_ATT, replaced)
    hdel_if_any(K_QUARANTINE, replaced)
    hdel_if_any(K_ERR, replaced)
    hdel_if_any(K_TRACE, replaced)
    unline(replaced)
    hdel_if_any(K_SERIAL, replaced)
    redis.call('HINCRBY', K_STATS, 'replaced', n)
  end,
}
