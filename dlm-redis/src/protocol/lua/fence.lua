-- Fence: draw the fencing token of a hold, if the lock is still ours, in one step (a
-- holder that lost its lock never gets a token afterwards).
-- KEYS[1] lock key, KEYS[2] the fencing stream of the lock's slot
-- ARGV[1] owner token, ARGV[2] a proposed stream ID 'ms-seq' (Redlock) or '0' for none,
-- ARGV[3] the stream's ttl in ms
-- Returns {0, 0}  not ours,
--         {1, id} the proposal was taken: the stream exists and its last ID was below it;
--                 it is now the stream's last ID,
--         {2, id} a new ID drawn (XADD ... *): larger than the stream's last ID, and from
--                 the server's clock when the stream is new (a proposal never creates a
--                 stream: a lost stream starts again from the clock),
--         {-3, 0} the fencing stream is not a stream (not written by dlm; left as it was).
-- A token is ms << 20 | seq: a draw whose sequence number would pass 2^20 - 1 (a stream
-- ahead of the server's clock, drawn from a million times in one millisecond) carries to
-- (ms+1)-0 in the same step instead.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err and not string.find(v.err, 'WRONGTYPE', 1, true) then
  return v -- an error other than a foreign key (e.g. an ACL denial) is raised
end
if v ~= ARGV[1] and v ~= ARGV[1] .. '~' then -- not ours (a waiter's mark is '~')
  return {0, 0}
end
local function failed(r)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return {-3, 0}
    end
    return r
  end
  return nil
end
if ARGV[2] ~= '0' then
  local r = redis.pcall('XADD', KEYS[2], 'NOMKSTREAM', 'MAXLEN', '0', ARGV[2], 'f', '1')
  if type(r) == 'string' then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return {1, r}
  end
  -- false: no stream; "equal or smaller than the target stream top item": past it. Both
  -- draw below.
  if not (r == false or string.find(r.err or '', 'equal or smaller', 1, true)) then
    return failed(r)
  end
end
local id = redis.pcall('XADD', KEYS[2], 'MAXLEN', '0', '*', 'f', '1')
local err = failed(id)
if err then
  return err
end
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
if tonumber(seq) > 1048575 then
  id = string.format('%.0f-0', tonumber(ms) + 1)
  redis.call('XADD', KEYS[2], 'MAXLEN', '0', id, 'f', '1')
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {2, id}
