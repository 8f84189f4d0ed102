-- Fence: draw the fencing token of a hold, if the lock is still ours, in one step (a
-- holder that lost its lock never gets a token afterwards). draw.lua is prepended.
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] a proposed stream ID 'ms-seq' (Redlock) or '0' for none,
-- ARGV[3] the stream's ttl in ms
-- Returns {0, 0} not ours, else what draw() returns.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v -- an error other than a foreign key (e.g. an ACL denial) is raised
end
if v ~= ARGV[1] and v ~= ARGV[1] .. '~' then -- not ours (a waiter's mark is '~')
  return {0, 0}
end
return draw(KEYS[2], ARGV[2], ARGV[3])
