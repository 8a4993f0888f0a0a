-- now.lua: the queue clock (see include/clock.lua), read without writing: a push of
-- many delayed messages reads it first, so that the client can stamp their envelopes
-- (see push.lua's "stamped" runs) and Redis builds no string a message.
-- Returns now_ms.
-- @include clock
-- KEYS: control
return queue_now(false)
