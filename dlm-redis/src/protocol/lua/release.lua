-- Release: compare-and-delete; announce it on the lock's channel when a waiter marked the
-- key (its value then ends in '~', see take.lua): an uncontended release publishes
-- nothing.
-- KEYS[1] lock key; ARGV[1] release channel (not a key: for a name that begins with '}'
-- it hashes to another cluster slot than the lock key), ARGV[2] owner token, ARGV[3]
-- release id (the same on every Redlock node, so a listener hearing it twice wakes one
-- waiter)
-- Returns 1 when released, 2 when released and announced (the PUBLISH went out), 0 when
-- the lock was not ours.
-- PUBLISH runs under pcall: a user without channel permission still releases.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v -- an error other than a foreign key (e.g. an ACL denial) is raised
end
if v == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v == ARGV[2] .. '~' then
  redis.call('DEL', KEYS[1])
  if type(redis.pcall('PUBLISH', ARGV[1], ARGV[3])) == 'number' then
    return 2
  end
  return 1
end
return 0
