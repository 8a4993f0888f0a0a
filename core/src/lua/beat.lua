-- beat.lua: a consumer pool's heartbeat in the list of live pools, when no claim
-- carried it (claim.lua takes it along when it can: an idle pool then sends Redis
-- nothing more), and its goodbye when it stops.
-- ARGV[3] pool id   ARGV[4] ttl_ms, 0 when the pool has stopped   ARGV[5] info JSON
--   (opaque to Lua)
-- Returns the number of pools alive after this call.
-- Faults: permissions and key types are checked before its first write (preflight,
--   include/base.lua); that write takes no memory, so a full Redis lets it run.
-- @include clock
-- @include oom
-- @include pools
-- @include stall
-- KEYS: inflight stats workers control claims
run_even_out_of_memory()
local now = queue_now(true)
absorb_stall(now)
return register_pool(now, ARGV[3], tonumber(ARGV[4]), ARGV[5])
