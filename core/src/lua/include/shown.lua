-- shown.lua: what a listing sends, and a claim reads, of texts that a writer may have
-- made huge. A producer that bypasses its max_payload_bytes (or writes the hash
-- itself) must not make the listings, and the operators' tools built on them, too
-- slow to show its queue, nor hand a pool more than it reads: an envelope past the
-- caller's bound is sent as its size (a number) and never read, and an error or a
-- trace past its bound keeps its start and its end, as a worker cuts a trace
-- (consumer.rs, cut_trace).

-- No stored value is this large (Redis holds at most 512 MB in one): a bound at or past
-- it sends every value whole, without a look at its size.
local WHOLE = 2 ^ 40

-- The values of `fields` in `hash`, in order: the text, false when absent, or the
-- size in bytes of one larger than `max` (HSTRLEN: the value is not read).
local function sized_values(hash, fields, max)
  if max >= WHOLE then
    return redis.call('HMGET', hash, unpack(fields))
  end
  local out, small, at = {}, {}, {}
  for i, field in ipairs(fields) do
    local size = redis.call('HSTRLEN', hash, field)
    if size > max then
      out[i] = size
    else
      small[#small + 1] = field
      at[#at + 1] = i
    end
  end
  if #small > 0 then
    local read = redis.call('HMGET', hash, unpack(small))
    for j, i in ipairs(at) do
      out[i] = read[j]
    end
  end
  return out
end

-- Whether byte `i` of `text` continues a UTF-8 character (so a cut there would split it).
local function continues(text, i)
  local b = string.byte(text, i)
  return b ~= nil and b >= 128 and b < 192
end

-- `text` within `max` bytes: its start and its end around a note of how much was left
-- out, cut between UTF-8 characters; false stays false.
local function cut_text(text, max)
  if not text or #text <= max then
    return text
  end
  local room = max - #string.format('\n[... %d bytes left out ...]\n', #text)
  if room <= 0 then
    return ''
  end
  local head = math.floor(room / 2)
  while head > 0 and continues(text, head + 1) do
    head = head - 1
  end
  local tail = #text - (room - math.floor(room / 2)) + 1
  while tail <= #text and continues(text, tail) do
    tail = tail + 1
  end
  return string.sub(text, 1, head) .. string.format('\n[... %d bytes left out ...]\n', tail - head - 1)
    .. string.sub(text, tail)
end
