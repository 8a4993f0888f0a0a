-- base.lua: what every script shares; the crate puts it first in every script (Redis
-- Lua has no `require`), after the locals it generates from the script's header:
--   `-- @include NAME` lines name the pieces of include/ a script uses (each names its
--   own), and `-- KEYS: role ...` lists the keys it touches, by role. It receives
--   exactly those, in that order, bound to the K_ locals below; a unit test holds the
--   list to the K_ names the script and its includes use, so it cannot go stale.
--   ARGV[1] is the layout ("native" or "seed"), ARGV[2] the wake-up channel.
-- The roles, each with the type its key must hold (every key carries the queue's hash
-- tag, so a script touches a single slot and runs unchanged on a cluster):
--   scheduled  ZSET  id -> score (due time, see include/order.lua)
--   messages   HASH  id -> envelope (opaque to Lua but for its stamp, see
--                            include/stamp.lua: payload bytes never pass through
--                            cjson, so 64-bit integers and key order survive)
--   inflight   ZSET  id -> lease deadline (ms, server clock) of a delivery
--                            detached from its claim (see include/claims.lua)
--   leases     HASH  id -> lease of the current delivery (see lease_score)
--   attempts   HASH  id -> finished deliveries (written when a delivery fails, or
--                            its lease expires claimed alone or past its timeout, see
--                            claim.lua; the running one is attempts + 1)
--   errors     HASH  id -> last error text
--   dead       ZSET  id -> time of death (ms)
--   stats      HASH  counters: pushed delivered acked retried dead ...
--   seq        STRING  monotonic counter (FIFO order and lease tokens)
--   workers   HASH  pool id -> "<expires_ms>|<seen_ms>|<info JSON>" of the
--                            consumer pools alive (see beat.lua)
--   paused    HASH  since -> time of the pause (ms); while it exists, consumers
--                            claim nothing (see pause.lua)
--   repeats   HASH  name -> definition of a repeating message (JSON text the
--                            crate writes and reads; opaque here, compared whole)
--   repeat_marks HASH name -> due time (ms) of the latest occurrence pushed:
--                            each occurrence is pushed at most once
--   limit     HASH  the rate limit (see limit.lua): max (this partition's
--                            share), per (ms), total (the queue's max), used (grants
--                            still in the window)
--   limit_log ZSET  "<seq>:<count>" -> time (ms) of each claim's grant under
--                            the rate limit, for as long as it is in the window
--   control   HASH  restart_gen -> how many requests that running consumer pools
--                            stop were made, restart_at -> time (ms) of the latest
--                            (see restart.lua); seen_ms, stall_ms -> when a pool
--                            script last ran, half a lease (see stall.lua);
--                            clock_ms, step_ms, step_at -> the queue's clock,
--                            format -> the stored format's version (see clock.lua)
--   completed ZSET  id -> time (ms) it was acknowledged, for the messages kept
--                            after completion (QueueOptions::keep_completed)
--   completed_messages HASH id -> "<attempts>|<due_ms>|<envelope>" of each
--                            kept completed message
--   traces    HASH  id -> stack trace of the last error, when the handler's
--                            language gave one (a failed delivery without one clears it)
--   serial_keys HASH id -> serial key of a message pushed with one: messages
--                            sharing it never run at the same time (see serial_gate)
--   serial_holders HASH serial key -> id of the delivery that holds it (while
--                            that id holds a lease); a group's key ("\1" name) ->
--                            how many of its deliveries hold a lease, "\2" name ->
--                            its starts still in its rate window
--   serial_line ZSET "<key>\0<score>\0<id>" (scores all 0: ordered by key, then
--                            by the score the message was due at): messages waiting
--                            for their key
--   serial_lined HASH id -> its member of serial_line
--   minutes   HASH  minute (queue clock ms / 60000) -> what the consumer pools
--                            did in it and the backlog then (see minutes_add.lua)
--   claims    ZSET  claim token -> its lease deadline (ms), while it holds a
--                            message (see include/claims.lua)
--   claim_ids HASH  claim token -> its ids (cmsgpack); "<token>#" -> how many it
--                            still holds
--   quarantine HASH id -> the size of claim a waiting message whose claim expired
--                            may next be taken in (see include/quarantine.lua)
--   group_grants ZSET "<group key>\0<claim token>\0<count>" -> when (ms) the
--                            starts a claim granted a group under its rate limit
--                            leave the window (see include/group_limits.lua)
-- Scripts return error replies only for caller bugs, as "DQERR <code> <detail>", and
-- for the faults the preflight finds before the first write (below).

-- The preflight, which scripts::compose writes into every script after its includes
-- and before its own code, line by line (a table of its arguments, built at every
-- call, cost more than the checks around it): before a script's first write, every
-- command it can run is allowed for this user on these keys and channel (Redis 7.0+
-- can tell; before it a missing command still stops the script at that command),
-- each checked once with a key or channel of this queue, and no key holds another
-- type than its role's (checked only where the user may run TYPE: rules written
-- before delayq asked for it go on working). A fault found there is the script's
-- error reply ("NOPERM delayq script S runs C on K", "WRONGTYPE delayq script S: key K
-- holds a T, delayq keeps a U there") and leaves every key as it was; one found later
-- would have kept the writes made before it (Redis does not roll a script back), so
-- a script that moves a message between states writes the new state before it leaves
-- the old one (claim, nack): even an error past the preflight leaves no message
-- without a state.

-- Native scores are due_ms * SEQ_SPAN plus the message's place among those due in
-- the same millisecond (see include/order.lua). due_ms * 4096 stays below 2^53, where
-- doubles hold every integer, for due times until September 2039; a later due time
-- is rounded to a multiple of 2 (8 by the year 2150), which can reorder messages due
-- in the same millisecond and make one up to 1 ms late, never early. The seed layout
-- keeps the recipe's whole-second scores so the recipe's own consumers keep working.
local SEQ_SPAN = 4096

-- Stop the script with an error reply: Redis 7 replies with a raised error table as
-- it is, Redis 6 only with a raised string (it prints a table as "(null)").
local function raise(reply)
  if redis.REDIS_VERSION_NUM then
    error(reply)
  end
  error(reply.err, 0)
end

local function fmt(n)
  return string.format('%.0f', n)
end


local function due_of(score)
  if SEED then
    return score * 1000
  end
  return math.floor(score / SEQ_SPAN)
end

-- Highest score that is due at `ms`.
local function due_bound(ms)
  if SEED then
    return math.floor(ms / 1000)
  end
  return ms * SEQ_SPAN + SEQ_SPAN - 1
end

-- An expiring message's envelope ends with ,"expire_after_ms":<n>,"expires_ms":<ms>}
-- (envelope.rs writes it last); a new due time sets the deadline to due + n. Only the
-- last bytes are searched, so the payload's size costs nothing, and a payload cannot
-- end the envelope this way (it is followed by the closing brace). Other envelopes,
-- and the seed layout's bare payloads, come back as they are.
local EXPIRY_TAIL = ',"expire_after_ms":(%d+),"expires_ms":%-?%d+}$'
local function with_deadline(envelope, due_ms)
  if SEED then
    return envelope
  end
  local start, _, after = string.find(envelope, EXPIRY_TAIL, math.max(1, #envelope - 80))
  if not start then
    return envelope
  end
  return string.sub(envelope, 1, start - 1) .. ',"expire_after_ms":' .. after .. ',"expires_ms":'
    .. fmt(due_ms + tonumber(after)) .. '}'
end

-- A lease is the fencing token of one claim (unique; one claim's deliveries share
-- it, and one claim holds a message at most once), followed by ":<score>", the
-- schedule score it was claimed at (a release puts it back there, and it gives the
-- due time), in the seed layout, whose payloads carry no stamp (include/stamp.lua);
-- a native message's stamp holds that score. Completions send the whole string back
-- and compare it as one value: no parsing on the hot path. Which delivery of the message this is needs no
-- storing: attempts holds the finished ones, so the running one is attempts + 1.
-- Returns the score a lease carries, nil for a token alone.
local function lease_score(lease)
  return tonumber(string.match(lease, '^[^:]+:([^:]+)$'))
end

-- A member of key's line: the score it was due at (its digits, as text) and its id.
local function line_entry(member, key)
  return string.match(string.sub(member, #key + 2), '^(%d+)%z(.*)$')
end

