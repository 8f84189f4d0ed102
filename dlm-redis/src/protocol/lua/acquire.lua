-- Acquire: take the lock if free, refresh it if already ours (idempotent retry).
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] fencing: '0' none, '1' draw a new ID from
--   the fencing stream (XADD ... MAXLEN 0 *: seeded from the server's clock when the stream
--   is new, and larger than every ID it gave before), ARGV[4] the stream's ttl in ms
-- Returns {1, id} acquired (id: the new stream ID, a string; 0 when fencing is off),
--         {0, pttl} held by someone else (another dlm holder's key is then marked: its
--                   value gets a '~' suffix, which tells the holder's release to PUBLISH
--                   because someone waits),
--         {-1, 0}   a key of another type is at the lock name,
--         {-2, 0}   the key has no expiry (not written by dlm),
--         {-3, 0}   the fencing stream is not a stream (not written by dlm; the lock is not
--                   kept).
-- The free case comes first and costs one SET (plus the stream): every server call in a
-- script is paid for on each acquisition. SET NX does not look at the type of an existing
-- key; the GET below does.
local function draw()
  if ARGV[3] ~= '1' then
    return 0
  end
  local id = redis.pcall('XADD', KEYS[2], 'MAXLEN', '0', '*', 'f', '1')
  if type(id) == 'table' and id.err then
    return id
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return id
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local id = draw()
  if type(id) == 'table' then
    redis.call('DEL', KEYS[1]) -- no token, no lock
    if string.find(id.err, 'WRONGTYPE', 1, true) then
      return {-3, 0}
    end
    return id -- any other error (e.g. an ACL denial) is raised to the client
  end
  return {1, id}
end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then
    return {-1, 0}
  end
  return v -- any other error (e.g. an ACL denial) is raised to the client
end
if v == ARGV[1] or v == ARGV[1] .. '~' then
  -- Ours already (a retry after a lost reply): refreshed, with a fresh, larger token.
  local id = draw()
  if type(id) == 'table' then
    if string.find(id.err, 'WRONGTYPE', 1, true) then
      return {-3, 0}
    end
    return id
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, id}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return {-2, 0}
end
-- Mark another dlm holder's key (an owner token: 32 hex digits, ':', thread, ':', sequence)
-- once; a value of any other shape is not dlm's to touch.
if string.find(v, '^%x+:%d+:%d+$') then
  redis.call('APPEND', KEYS[1], '~')
end
return {0, ttl}
