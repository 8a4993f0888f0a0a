-- stamp.lua: the stamp at the front of a native envelope, {"at":[<claim no>,<score>],...
--   score     the schedule score the message was last given with a due time (its due
--             time and its place in that millisecond, see include/order.lua): a claim
--             reads it here, not from the schedule, whose scores Redis before 7.2
--             prints with printf, the most costly step of a claim; a release puts the
--             message back there;
--   claim no  the queue's sequence (K_SEQ) when it was written: every claim made
--             later takes a higher number (kept for a fence that reads the stamp
--             alone; include/claims.lua's fence is the lease); 0 where a producer
--             stamped a new message with an id made for its push, which no claim
--             can have held (push.lua's "stamped" runs).
-- Written by every script that puts a native message in the schedule (or, for a
-- push, checked where the producer wrote it): a push, a repeat's occurrence, a
-- reschedule, a requeue, a retry, a release, the reaper. A delayq before the stamp,
-- mid-deploy, moves messages without it: a stamp is trusted no later than the claim
-- that reads it.
-- Readers of the envelope skip the field (envelope.rs, and delayq before it), and the
-- seed layout's bare payloads carry none. Envelopes from a delayq before the stamp
-- have none until a script puts them in the schedule again. A claim that reads the
-- envelopes (serial keys) gives such a lease the score ("<token>:<score>", see
-- include/base.lua); one that leaves them to its caller cannot tell them apart, and
-- the message runs with the claim's time as its due time.
local STAMP_OPEN = '{"at":['

local function is_stamped(envelope)
  return string.sub(envelope, 1, 7) == STAMP_OPEN
end

-- The score of a message claimed by `now` as its stamp tells it, nil for no envelope
-- or one without a stamp. No later than now's: a claimed message was due, and a delayq
-- before the stamp, mid-deploy, moves messages without stamping them again.
local function stamp_score(envelope, now)
  local score = envelope and tonumber(string.match(envelope, '^{"at":%[%d+,(%d+)%],'))
  return score and math.min(score, due_bound(now))
end
