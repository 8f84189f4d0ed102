-- Commit (Redlock fencing, round 2): raise the slot's fencing stream to the ID of token T
-- while the lock is still ours.
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] T as a stream ID ('ms-seq'), ARGV[3] the stream's ttl in ms
-- Returns 1 when committed (the stream's last ID is now >= T), 0 when the lock is not ours.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v
end
if v ~= ARGV[1] and v ~= ARGV[1] .. '~' then -- not ours (a waiter's mark is '~')
  return 0
end
local r = redis.pcall('XADD', KEYS[2], 'MAXLEN', '0', ARGV[2], 'f', '1')
-- "equal or smaller than the target stream top item": the stream is past T already.
if type(r) == 'table' and r.err and not string.find(r.err, 'equal or smaller', 1, true) then
  return r
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
