-- Acquire with the fencing token: acquire.lua, and where the lock is taken (or already
-- ours), the token's draw in the same step (draw.lua is prepended). Used when the token
-- will probably be read; otherwise the plain SET NX, and fence.lua when it is read.
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] a proposed stream ID 'ms-seq'
-- (Redlock) or '0' for none, ARGV[4] the stream's ttl in ms
-- Returns {1, id}   acquired, the proposal taken (see draw.lua),
--         {2, id}   acquired, a new ID drawn,
--         {3, 0}    acquired, no token drawn (the draw failed: a foreign key at the
--                   stream's name, an ACL denial; the front draws on read, and fails there),
--         {0, pttl} held by someone else (another dlm holder's key is then marked, as in
--                   acquire.lua),
--         {-1, 0}   a key of another type is at the lock name,
--         {-2, 0}   the key has no expiry (not written by dlm).
local function acquired()
  local r = draw(KEYS[2], ARGV[3], ARGV[4])
  if r.err or r[1] < 0 then
    return {3, 0}
  end
  return r
end
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
if string.find(v, '^%x+:%d+:%d+$') then
  redis.call('APPEND', KEYS[1], '~')
end
return {0, ttl}
