-- guard.lua: for a script composed without the preflight (a `-- @guarded` header, see
-- push_one.lua): it finds a fault where the command meets it instead. Within the
-- script, redis.call turns a refused command into the error the preflight would have
-- given ("NOPERM delayq script S runs C on K", "WRONGTYPE delayq script S: key K holds
-- a T, delayq keeps a U there"), so the script must run every read before its first
-- write, and undo its own writes where a later one fails (redis.pcall, then fault()
-- with `undone`, which ends the error with " (undone)": the crate then says that what
-- was written was taken back, not that nothing was written).
-- Must be the script's first include: the includes after it call through it.
-- Up to the table below, and within it, `redis` is Redis's own, looked up at each
-- call: a library's functions are defined while Redis loads it, when `redis` holds
-- only what loading may call (nor may loading call setmetatable, so the table names
-- each function the scripts use).

local function fault(reply, command, key, undone)
  local text = reply.err
  local tail = undone and ' (undone)' or ''
  if string.find(text, 'NOPERM', 1, true) or string.find(text, "can't run this command", 1, true) then
    if key then
      return redis.error_reply('NOPERM delayq script ' .. SCRIPT .. ' runs ' .. command .. ' on ' .. key .. tail)
    end
    return redis.error_reply('NOPERM delayq script ' .. SCRIPT .. ' runs ' .. command .. tail)
  end
  if string.sub(text, 1, 9) == 'WRONGTYPE' and key then
    local held = redis.pcall('TYPE', key)
    return redis.error_reply('WRONGTYPE delayq script ' .. SCRIPT .. ': key ' .. key .. ' holds a '
      .. tostring(held.ok or held) .. ', delayq keeps a ' .. KIND_OF(key) .. ' there' .. tail)
  end
  return reply
end

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local redis = {
  call = function(...)
    local reply = redis.pcall(...)
    if failed(reply) then
      local command, key = ...
      raise(fault(reply, command, key))
    end
    return reply
  end,
  pcall = function(...)
    return redis.pcall(...)
  end,
  error_reply = function(text)
    return redis.error_reply(text)
  end,
}
