-- find.lua: one step of a scan for the messages whose id or stored text contains a
-- string: what an operator has ("where is the job of order 10086?") when the ids are
-- generated ones. HSCAN steps, so that no call blocks Redis for long however large the
-- queue; the text is compared here, so only the matches travel.
-- ARGV[3] "messages" (every message alive: waiting, running or dead) or "completed"
--   (the kept completed ones)   ARGV[4] the HSCAN cursor ("0" to start)
--   ARGV[5] the text (compared plainly, no patterns)   ARGV[6] fields to look at (COUNT)
-- Returns {next cursor ("0" when the scan is done), matching id, ...}. A message
-- written or deleted during the scan may be missed or seen twice (HSCAN's guarantee).
-- Faults: it writes nothing.
-- KEYS: messages completed_messages
local hash = ARGV[3] == 'completed' and K_DONE_MSG or K_MSG
local step = redis.call('HSCAN', hash, ARGV[4], 'COUNT', ARGV[6])
local text = ARGV[5]
local result = {step[1]}
local entries = step[2]
for i = 1, #entries, 2 do
  if string.find(entries[i], text, 1, true) or string.find(entries[i + 1], text, 1, true) then
    result[#result + 1] = entries[i]
  end
end
return result
