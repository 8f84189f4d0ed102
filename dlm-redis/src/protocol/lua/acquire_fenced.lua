-- Acquire with the fencing token: the acquisition rule (take.lua), and where the lock is
-- taken (or already ours), the token's draw in the same step (draw.lua; both are
-- prepended). Used when the token will probably be read; otherwise the plain SET NX, and
-- fence.lua when it is read.
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] a proposed stream ID 'ms-seq'
-- (Redlock) or '0' for none, ARGV[4] the stream's ttl in ms
-- Returns {1, id}   acquired, the proposal taken (see draw.lua),
--         {2, id}   acquired, a new ID drawn,
--         {3, 0}    acquired, no token drawn (the draw failed: a foreign key at the
--                   stream's name, an ACL denial; the front draws on read, and fails there),
--         or what take.lua returns when the lock is not taken.
return take(function()
  local r = draw(KEYS[2], ARGV[3], ARGV[4])
  if r.err or r[1] < 0 then
    return {3, 0}
  end
  return r
end)
