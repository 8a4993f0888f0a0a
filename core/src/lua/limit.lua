-- limit.lua: set or clear the queue's rate limit: at most `max` messages handed to
-- consumers (claimed) in any window of `per` ms, for every pool on every host. The
-- claim keeps a log of its grants (see claim.lua), so the cap holds for every window,
-- not only for windows aligned to the clock.
-- ARGV[3] this partition's share of max ("" to clear the limit), ARGV[4] per (ms),
-- ARGV[5] the queue's max (the sum of the shares, reported by stats).
-- Returns 1 if a limit was in force before, 0 if not.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include schedule
-- KEYS: scheduled limit limit_log
local before = redis.call('EXISTS', K_LIMIT)
if ARGV[3] == '' then
  redis.call('UNLINK', K_LIMIT, K_LIMIT_LOG)
else
  -- The log of grants stays: what was handed out within the window still counts
  -- against a changed limit.
  redis.call('HSET', K_LIMIT, 'max', ARGV[3], 'per', ARGV[4], 'total', ARGV[5])
end
-- Consumers held back by the old limit sleep until its window frees; a raised or
-- cleared limit must wake them.
wake_if_earlier(nil, head_score())
return before
