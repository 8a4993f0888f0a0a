-- forget.lua: delete messages with everything kept about them.
-- @include serial
-- @include hdel_if_any
-- The messages ids[first..last] (default: all): an ack deletes its usual batch
-- straight from ARGV, with no table of them built.
local function forget(ids, first, last)
  first, last = first or 1, last or #ids
  if last < first then
    return
  end
  if redis.call('EXISTS', K_SERIAL) == 1 then
    local these = {unpack(ids, first, last)}
    unline(these)
    redis.call('HDEL', K_SERIAL, unpack(these))
  end
  redis.call('HDEL', K_MSG, unpack(ids, first, last))
  hdel_if_any(K_ATT, ids, first, last)
  hdel_if_any(K_ERR, ids, first, last)
  hdel_if_any(K_TRACE, ids, first, last)
  hdel_if_any(K_QUARANTINE, ids, first, last)
  redis.call('HDEL', K_LEASE, unpack(ids, first, last))
end
