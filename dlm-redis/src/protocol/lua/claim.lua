-- Claims: the holds of a semaphore or a read-write lock (draw.lua is prepended).
-- KEYS[1] the resource's hash (prefix:{name}:sem or prefix:{name}:rw), KEYS[2] the
-- fencing stream of that key's slot.
-- The hash's fields: 'h:<member>' one per holder, value '<expiry ms>,<stream ID or empty>'
-- or '<expiry ms>,<stream ID or empty>,<label>' (member 'p:<owner>' a permit, 'r:<owner>'
-- a read hold, 'w:<owner>' a write hold; the label says who holds it, for inspection);
-- 'p' the semaphore's permit count while anyone holds a permit; 'm' until when a waiting
-- writer holds new readers back (ms); 'x' set by a refused attempt: someone waits, so a
-- release publishes. Expiries are the server's clock (TIME), never the client's. The key
-- expires (PEXPIREAT) at the latest expiry it holds; expired holders are dropped before
-- anything is decided.
-- ARGV[1] the operation, ARGV[2] the member, then per operation:
--   acquire   ARGV[3] ttl ms, ARGV[4] permits ('0': read-write lock), ARGV[5] '1' to draw
--             the token, ARGV[6] the writer's mark in ms, ARGV[7] the stream's ttl in ms,
--             ARGV[8] the holder's label ('' for none)
--             -> {1, id} acquired (id '' when no token), {0, ms} held (retry after),
--                {-4, permits} the semaphore is held with another permit count
--   extend    ARGV[3] ttl ms -> {1, ''} extended, {0, ''} not ours
--   release   ARGV[3] channel, ARGV[4] release id -> {1, ''} released, {0, ''} not ours
--   downgrade ARGV[3] ttl ms, ARGV[4] the reader's member, ARGV[5] channel, ARGV[6]
--             release id -> {1, id} the read hold (the write hold's token and label),
--             {0, ''}
--   fence     ARGV[3] the stream's ttl in ms -> {0, 0} not ours, else what draw() returns
--   force     ARGV[3] channel, ARGV[4] release id -> {1, ''} something was held, {0, ''}
--   relabel   ARGV[3] the new label, ARGV[4] channel, ARGV[5] release id -> {1, ''}
--             relabelled (and announced), {0, ''} not ours
--   inspect   -> {holders, permit count (0: none), {class, remaining ms, label, stream
--             ID or '', ...}} with class 'p', 'r' or 'w' per holder (read only)
-- A semaphore of one permit is an election: its grants (acquire's ARGV[9] channel,
-- ARGV[10] release id), releases and relabels are published whether or not anyone
-- waits, for its observers.
-- Every operation answers {-1, 0} for a key of another type and {-2, 0} for a hash that
-- dlm did not write (no expiry, or fields of another shape), and leaves such a key as it was.
local key, op, member = KEYS[1], ARGV[1], ARGV[2]
-- One read for the type and the fields: HGETALL refuses a key of another type, and an
-- existing hash is never empty.
local flat = redis.pcall('HGETALL', key)
if flat.err then
  if string.find(flat.err, 'WRONGTYPE', 1, true) then
    return {-1, 0}
  end
  return flat -- any other error (e.g. an ACL denial) is raised to the client
end
local exists = #flat > 0

-- The common release: the caller is the only holder and no writer waits. The key expires
-- with its latest holder, so ours is live if it is there; the key goes, with no clock
-- read (a waiter that was refused is woken).
if op == 'release' and exists then
  local mine, only, someone_waits = 'h:' .. member, true, false
  local found = false
  for i = 1, #flat, 2 do
    local f = flat[i]
    if f == mine then
      found = true
    elseif f == 'x' then
      someone_waits = true
    elseif f == 'p' then
      if flat[i + 1] == '1' then
        someone_waits = true -- an election: observed
      end
    else
      only = false
      break
    end
  end
  if found and only then
    redis.call('DEL', key)
    if someone_waits then
      redis.pcall('PUBLISH', ARGV[3], ARGV[4])
    end
    return {1, ''}
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders, count, gone = {}, 0, {}
local permits, mark, waited
if exists then
  if redis.call('PTTL', key) < 0 then
    return {-2, 0}
  end
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if string.sub(f, 1, 2) == 'h:' then
      local exp, id, rest = string.match(v, '^(%d+),([^,]*)(.*)$')
      if not exp then
        return {-2, 0}
      end
      exp = tonumber(exp)
      if exp > now then
        holders[string.sub(f, 3)] = {exp, id, string.sub(rest, 2)}
        count = count + 1
      else
        gone[#gone + 1] = f
      end
    elseif f == 'p' then
      permits = v
    elseif f == 'm' then
      mark = tonumber(v)
      if not mark then
        return {-2, 0}
      end
      if mark <= now then
        mark = nil
        gone[#gone + 1] = 'm'
      end
    elseif f == 'x' then
      waited = true
    else
      return {-2, 0}
    end
  end
end

if op == 'inspect' then
  local list = {}
  for m, h in pairs(holders) do
    list[#list + 1] = string.sub(m, 1, 1)
    list[#list + 1] = h[1] - now
    list[#list + 1] = h[3]
    list[#list + 1] = h[2]
  end
  return {count, tonumber(permits or '0') or 0, list}
end
if #gone > 0 then
  redis.call('HDEL', key, unpack(gone))
end

-- Sets holder m's field, labelled `label` ('' for none) (and, for a new permit holder,
-- the permit count in the same call: `extra` is {'p', count} or nil).
local function put(m, exp, id, label, extra)
  local v = string.format('%.0f,%s', exp, id)
  if label ~= '' then
    v = v .. ',' .. label
  end
  if extra then
    redis.call('HSET', key, 'h:' .. m, v, extra[1], extra[2])
  else
    redis.call('HSET', key, 'h:' .. m, v)
  end
  if not holders[m] then
    count = count + 1
  end
  holders[m] = {exp, id, label}
end

local function drop(m)
  holders[m] = nil
  count = count - 1
  if count > 0 or mark or op ~= 'release' then
    redis.call('HDEL', key, 'h:' .. m)
  end -- else the release's settle() deletes the key
end

-- The key's expiry: the latest of its holders' and of the writer's mark; no key once
-- neither is left.
local function settle()
  if count == 0 and not mark then
    redis.call('DEL', key)
    return
  end
  if count == 0 then
    redis.call('HDEL', key, 'p')
  end
  local last = mark or 0
  for _, h in pairs(holders) do
    if h[1] > last then
      last = h[1]
    end
  end
  redis.call('PEXPIREAT', key, string.format('%.0f', last))
end

-- Wakes the waiters (every one: several may get in) when someone waits, and an
-- election's observers.
local function announce(channel, id)
  if waited then
    redis.call('HDEL', key, 'x')
    waited = nil
    redis.pcall('PUBLISH', channel, id)
  elseif permits == '1' then
    redis.pcall('PUBLISH', channel, id)
  end
end

local function soonest(only_writers)
  local s
  for m, h in pairs(holders) do
    if (not only_writers or string.sub(m, 1, 2) == 'w:') and (not s or h[1] < s) then
      s = h[1]
    end
  end
  return s
end

-- A token drawn for a hold found ours; '' when the draw failed (read later, it fails
-- there).
local function token(ttl)
  local r = draw(KEYS[2], '0', ttl)
  if r.err or r[1] < 0 then
    return ''
  end
  return r[2]
end

local mine = holders[member]

if op == 'acquire' then
  local ttl, want, fenced, markms = tonumber(ARGV[3]), ARGV[4], ARGV[5] == '1', tonumber(ARGV[6])
  if want ~= '0' and count > 0 and permits and permits ~= want then
    return {-4, tonumber(permits)}
  end
  if mine then
    -- Ours already (a retry after a lost reply): refreshed.
    local id = mine[2]
    if fenced and id == '' then
      id = token(ARGV[7])
    end
    put(member, now + ttl, id, mine[3])
    settle()
    return {1, id}
  end
  local class, retry = string.sub(member, 1, 2), nil
  if class == 'p:' then
    if count >= tonumber(want) then
      retry = soonest(false) - now
    end
  elseif class == 'r:' then
    local w = soonest(true)
    if w then
      retry = w - now
    elseif mark then
      retry = mark - now
    end
  elseif count > 0 then
    -- A writer, others inside: new readers wait behind it from now on, while it comes
    -- back before its mark ends.
    mark = now + markms
    redis.call('HSET', key, 'm', string.format('%.0f', mark))
    retry = math.min(soonest(false) - now, math.max(1, math.floor(markms / 3)))
  end
  if retry then
    if not waited then
      redis.call('HSET', key, 'x', '1')
    end
    settle()
    return {0, retry}
  end
  local extra
  if class == 'p:' and permits ~= want then
    extra = {'p', want}
  elseif class == 'w:' and mark then
    redis.call('HDEL', key, 'm')
    mark = nil
  end
  local id = ''
  if fenced then
    id = token(ARGV[7])
  end
  put(member, now + ttl, id, ARGV[8] or '', extra)
  settle()
  if want == '1' and ARGV[9] then
    redis.pcall('PUBLISH', ARGV[9], ARGV[10]) -- a new leader: for the observers
  end
  return {1, id}
elseif op == 'extend' then
  if not mine then
    return {0, ''}
  end
  put(member, now + tonumber(ARGV[3]), mine[2], mine[3])
  settle()
  return {1, ''}
elseif op == 'release' then
  if not mine then
    return {0, ''}
  end
  drop(member)
  announce(ARGV[3], ARGV[4])
  settle()
  return {1, ''}
elseif op == 'downgrade' then
  if not mine or string.sub(member, 1, 2) ~= 'w:' then
    return {0, ''}
  end
  drop(member)
  put(ARGV[4], now + tonumber(ARGV[3]), mine[2], mine[3])
  announce(ARGV[5], ARGV[6])
  settle()
  return {1, mine[2]}
elseif op == 'relabel' then
  if not mine then
    return {0, ''}
  end
  put(member, mine[1], mine[2], ARGV[3])
  redis.pcall('PUBLISH', ARGV[4], ARGV[5])
  return {1, ''}
elseif op == 'fence' then
  if not mine then
    return {0, 0}
  end
  local r = draw(KEYS[2], '0', ARGV[3])
  if r.err or r[1] < 0 then
    return r
  end
  put(member, mine[1], r[2], mine[3])
  return r
elseif op == 'force' then
  if not exists then
    return {0, ''}
  end
  redis.call('DEL', key)
  redis.pcall('PUBLISH', ARGV[3], ARGV[4])
  if count > 0 then
    return {1, ''}
  end
  return {0, ''}
end
return redis.error_reply('dlm: unknown claim operation ' .. tostring(op))
