-- oom.lua: let a draining script write when Redis is at its maxmemory.
-- A Redis at its maxmemory refuses a script's first write when that command could take
-- memory, and lets a script that has written already run to its end (it cannot stop
-- one halfway). The scripts that drain the queue (claim, ack, nack, release, extend, a
-- pool's heartbeat) free memory or move entries between keys, and must not be refused
-- then, or a full Redis would stay full: they begin with this write, which takes none
-- and changes nothing (so it is not replicated either). Pushes are refused whole, before
-- anything is written.
local function run_even_out_of_memory()
  redis.call('HDEL', K_STATS, '')
end
