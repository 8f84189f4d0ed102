-- Inspect: the holder's remaining lease.
-- KEYS[1] lock key
-- Returns the PTTL in ms (>= 0), -3 when free, -1 for a key of another type,
-- -2 for a key without expiry.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then
    return -1
  end
  return v -- any other error (e.g. an ACL denial) is raised to the client
end
if v == false then
  return -3
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return -2
end
return ttl
