-- stamp.lua: the stamp at the front of a native envelope, {"at":[0,<score>],...
--   score     the schedule score the message was last given with a due time (its due
--             time and its place in that millisecond, see include/order.lua): a claim
--             reads it here, not from the schedule, whose scores Redis before 7.2
--             prints with printf, the most costly step of a claim; a release puts the
--             message back there.
--   The number before it is 0, or the cancel mark of a message that runs: -1
--   cancelled, -2 cancelled and its process to be killed (cancel.lua). The build
--   before this one neither reads nor writes a mark: where it restamps a marked
--   envelope it writes its stamp in front, and the marked one stays behind it as a
--   second field that only the first is read of (tests/test_rolling_deploy.py).
--   Writing the stamp anew (a schedule) writes 0.
-- Written by every script that puts a native message in the schedule (or, for a
-- push, checked where the producer wrote it): a push, a repeat's occurrence, a
-- reschedule, a requeue, a retry, a release, the reaper. The serial gate alone moves
-- a message without it, to a later score, and its line brings it back to the stamp's.
-- Readers of the envelope skip the field (envelope.rs), and the seed layout's bare
-- payloads carry none. A native envelope without one is a hand edit: its message
-- runs with the claim's time as its due time, and a release puts it back due now.
local STAMP_OPEN = '{"at":['

-- The score of a message claimed by `now` as its stamp tells it, nil for no envelope
-- or one without a stamp. No later than now's: a claimed message was due, whatever a
-- hand edit wrote.
local function stamp_score(envelope, now)
  local score = envelope and tonumber(string.match(envelope, '^{"at":%[%-?%d+,(%d+)%],'))
  return score and math.min(score, due_bound(now))
end

-- The cancel mark of a native envelope (see above): 1 or 2, else 0 (none, no
-- envelope, no stamp).
local function cancel_mark(envelope)
  return envelope and tonumber(string.match(envelope, '^{"at":%[%-([12]),%d+%],')) or 0
end

-- `envelope` with the cancel mark `mark` (1 or 2), nil for one without a stamp.
local function cancel_marked(envelope, mark)
  local _, stamp_end, score = string.find(envelope, '^{"at":%[%-?%d+,(%d+)%],')
  if not stamp_end then
    return nil
  end
  return STAMP_OPEN .. '-' .. mark .. ',' .. score .. '],' .. string.sub(envelope, stamp_end + 1)
end
