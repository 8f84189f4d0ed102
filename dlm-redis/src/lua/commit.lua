-- Commit (Redlock fencing, round 2): raise the counter to T while the lock is still ours.
-- KEYS[1] lock key, KEYS[2] fence counter key; ARGV[1] owner token, ARGV[2] T
-- Returns 1 when committed (the counter is now >= T), 0 when the lock is not ours.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v
end
if v ~= ARGV[1] and v ~= ARGV[1] .. '~' then -- not ours (a waiter's mark is '~')
  return 0
end
local f = tonumber(redis.call('GET', KEYS[2]) or '0')
if f < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
