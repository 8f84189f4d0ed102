-- Extend: compare-and-PEXPIRE. Never re-creates a missing key.
-- KEYS[1] lock key; ARGV[1] owner token, ARGV[2] ttl in ms
-- Returns 1 when extended, 0 when the lock is not ours.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v -- an error other than a foreign key (e.g. an ACL denial) is raised
end
if v == ARGV[1] or v == ARGV[1] .. '~' then -- ours, perhaps marked by a waiter
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
