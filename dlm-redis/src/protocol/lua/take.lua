-- The acquisition rule, written once and prepended to acquire.lua and acquire_fenced.lua:
-- take the lock if free, refresh it if already ours (idempotent retry), and otherwise say
-- who holds it for how long.
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] ttl in ms
-- `acquired()` makes the reply when the lock is taken or already ours. Otherwise returns
--         {0, pttl} held by someone else (another dlm holder's key is then marked: its
--                   value gets a '~' suffix, which tells the holder's release to PUBLISH
--                   because someone waits),
--         {-1, 0}   a key of another type is at the lock name,
--         {-2, 0}   the key has no expiry (not written by dlm).
-- The free case comes first and costs one SET: every server call in a script is paid for
-- on each acquisition. SET NX does not look at the type of an existing key; the GET below
-- does.
local function take(acquired)
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return acquired()
  end
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' and v.err then
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      return {-1, 0}
    end
    return v -- any other error (e.g. an ACL denial) is raised to the client
  end
  if v == ARGV[1] or v == ARGV[1] .. '~' then
    -- Ours already (a retry after a lost reply): refreshed.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return acquired()
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    return {-2, 0}
  end
  -- Mark another dlm holder's key (an owner token: 32 hex digits, ':', thread, ':',
  -- sequence) once; a value of any other shape is not dlm's to touch.
  if string.find(v, '^%x+:%d+:%d+$') then
    redis.call('APPEND', KEYS[1], '~')
  end
  return {0, ttl}
end
