-- Force release: delete the lock whoever holds it (only a string key, never foreign data).
-- KEYS[1] lock key; ARGV[1] release channel (not a key, see release.lua), ARGV[2] release id
-- Returns 1 when a lock was deleted, 0 when it was free, -1 for a key of another type.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then
    return -1
  end
  return v -- any other error (e.g. an ACL denial) is raised to the client
end
if v == false then
  return 0
end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[1], ARGV[2])
return 1
