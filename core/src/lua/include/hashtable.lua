-- hashtable.lua: a fresh hash written as a hashtable, not a listpack.
-- Redis stores a small hash as a listpack and converts it once it passes
-- hash-max-listpack-entries (512 by default); filling a fresh listpack with a claim of 1000
-- leases costs about 4x what the same writes cost in a hashtable (measured: 1.4 ms
-- against 0.37 ms per 1000 on Redis 7.0), and the leases hash is fresh whenever the
-- pool has caught up (an empty hash is deleted). One value longer than
-- hash-max-listpack-value (64) in the same HSET makes Redis build a hashtable from
-- the start; Redis never turns it back, so the field can go at once. Ids are never
-- empty, so the empty field name is free.
-- (A literal: a library's definitions run where Redis has not yet given Lua its
-- string library.)
local LISTPACK_BREAKER = '.................................................................'
local function hset_as_hashtable(key, pairs)
  local n = #pairs
  pairs[n + 1] = ''
  pairs[n + 2] = LISTPACK_BREAKER
  redis.call('HSET', key, unpack(pairs))
  redis.call('HDEL', key, '')
end
