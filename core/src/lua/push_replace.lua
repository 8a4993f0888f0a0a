-- push_replace.lua: push.lua for a batch with a "replace" run (arguments and reply as
-- push.lua's). A replaced message starts afresh: its attempts, last error and trace go,
-- and so does its place in its serial key's line (include/replace.lua).
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); a full Redis refuses that write, before anything is written.
-- @include push_runs
-- @include replace
-- @adds
-- KEYS: scheduled messages inflight leases attempts errors dead stats control traces serial_keys serial_holders serial_line serial_lined claims claim_ids quarantine
return push_runs(REPLACING)
