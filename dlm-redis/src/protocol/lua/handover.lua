-- Hand-over: the release of a lock to a waiter of the releasing process, in one step. If
-- the lock is the releaser's, it becomes the successor's with a lease of its own and,
-- when asked, its fencing token drawn (draw.lua, prepended) after the releaser's: the key
-- never goes free, so nobody else can take it in between. A marked key stays marked
-- (others still wait, and the next release that lets it go free publishes).
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] the releaser's owner token, ARGV[2] the successor's owner token, ARGV[3] ttl
-- in ms, ARGV[4] '1' to draw the token, '0' not to, ARGV[5] the stream's ttl in ms
-- Returns what acquire_fenced.lua returns when it takes the lock ({2, id} handed over
-- with a new token, {3, 0} handed over without one: not asked for, or the draw failed),
-- or {0, 0}: the lock was not the releaser's (nothing written). Idempotent: sent again
-- after a lost reply (a cluster retrying on a new master), it finds the successor's
-- token and answers as the first did (a new token, if asked: larger still).
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v -- an error other than a foreign key (e.g. an ACL denial) is raised
end
local mark
if v == ARGV[1] or v == ARGV[2] then
  mark = ''
elseif v == ARGV[1] .. '~' or v == ARGV[2] .. '~' then
  mark = '~'
else
  return {0, 0}
end
redis.call('SET', KEYS[1], ARGV[2] .. mark, 'PX', ARGV[3])
if ARGV[4] ~= '1' then
  return {3, 0}
end
local r = draw(KEYS[2], '0', ARGV[5])
if r.err or r[1] < 0 then
  return {3, 0}
end
return r
