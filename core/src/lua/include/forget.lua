-- forget.lua: delete messages with everything kept about them.
-- @include serial
-- @include hdel_if_any
local function forget(ids)
  if #ids == 0 then
    return
  end
  if redis.call('EXISTS', K_SERIAL) == 1 then
    unline(ids)
    redis.call('HDEL', K_SERIAL, unpack(ids))
  end
  redis.call('HDEL', K_MSG, unpack(ids))
  hdel_if_any(K_ATT, ids)
  hdel_if_any(K_ERR, ids)
  hdel_if_any(K_TRACE, ids)
  redis.call('HDEL', K_LEASE, unpack(ids))
end
