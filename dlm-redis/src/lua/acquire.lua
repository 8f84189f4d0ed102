-- Acquire: take the lock if free, refresh it if already ours (idempotent retry).
-- KEYS[1] lock key, KEYS[2] fence counter key
-- ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] fencing: '0' none, '1' INCR the counter
--   (single instance), '2' read the counter (Redlock round 1; commit.lua is round 2)
-- Returns {1, fence} acquired (fence 0 when fencing is off; already ours: the counter),
--         {0, pttl} held by someone else (another dlm holder's key is then marked: its
--                   value gets a '~' suffix, which tells the holder's release to PUBLISH
--                   because someone waits),
--         {-1, 0}   a key of another type is at the lock name,
--         {-2, 0}   the key has no expiry (not written by dlm),
--         {-3, 0}   the fence counter is not a number (not written by dlm; the lock is
--                   not kept).
-- The free case comes first and costs one SET (plus the counter): every server call in a
-- script is paid for on each uncontended acquisition. SET NX does not look at the type of
-- an existing key; the GET below does.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    local n = redis.pcall('INCR', KEYS[2])
    if type(n) == 'table' then
      redis.call('DEL', KEYS[1]) -- no token, no lock
      if string.find(n.err, 'not an integer', 1, true) or string.find(n.err, 'WRONGTYPE', 1, true) then
        return {-3, 0}
      end
      return n -- any other error (e.g. an ACL denial) is raised to the client
    end
    return {1, n}
  elseif ARGV[3] == '2' then
    return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
  return {1, 0}
end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then
    return {-1, 0}
  end
  return v -- any other error (e.g. an ACL denial) is raised to the client
end
if v == ARGV[1] or v == ARGV[1] .. '~' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
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
