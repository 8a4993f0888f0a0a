-- hdel_if_any.lua: deletes skipped while a per-message hash does not exist.
-- Attempts and errors exist only for messages that failed before; while none has,
-- their hashes do not exist and the per-message deletes are skipped.
-- ids[first..last] (default: all of them).
local function hdel_if_any(key, ids, first, last)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HDEL', key, unpack(ids, first or 1, last or #ids))
  end
end
