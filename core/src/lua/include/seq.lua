-- seq.lua: the queue's sequence (FIFO order within a millisecond, lease tokens).
local function next_seq(count)
  return redis.call('INCRBY', K_SEQ, count or 1)
end
