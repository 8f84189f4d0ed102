-- The draw of a fencing token, shared by fence.lua and acquire_fenced.lua (prepended to
-- each): called only once the script has found the lock key to be the caller's.
-- draw(stream, proposal, ttl): stream the fencing stream of the lock's slot, proposal a
-- stream ID 'ms-seq' (Redlock) or '0' for none, ttl the stream's ttl in ms.
-- Returns {1, id} the proposal was taken: the stream exists and its last ID was below it;
--                 it is now the stream's last ID,
--         {2, id} a new ID drawn (XADD ... *): larger than the stream's last ID, and from
--                 the server's clock when the stream is new (a proposal never creates a
--                 stream: a lost stream starts again from the clock),
--         {-3, 0} the fencing stream is not a stream (not written by dlm; left as it was),
--         or an error table (e.g. an ACL denial).
-- A token is ms << 20 | seq: a draw whose sequence number would pass 2^20 - 1 (a stream
-- ahead of the server's clock, drawn from a million times in one millisecond) carries to
-- (ms+1)-0 in the same step instead.
local function draw(stream, proposal, ttl)
  local function failed(r)
    if type(r) == 'table' and r.err then
      if string.find(r.err, 'WRONGTYPE', 1, true) then
        return {-3, 0}
      end
      return r
    end
    return nil
  end
  if proposal ~= '0' then
    local r = redis.pcall('XADD', stream, 'NOMKSTREAM', 'MAXLEN', '0', proposal, 'f', '1')
    if type(r) == 'string' then
      redis.call('PEXPIRE', stream, ttl)
      return {1, r}
    end
    -- false: no stream; "equal or smaller than the target stream top item": past it. Both
    -- draw below.
    if not (r == false or string.find(r.err or '', 'equal or smaller', 1, true)) then
      return failed(r)
    end
  end
  local id = redis.pcall('XADD', stream, 'MAXLEN', '0', '*', 'f', '1')
  local err = failed(id)
  if err then
    return err
  end
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if tonumber(seq) > 1048575 then
    id = string.format('%.0f-0', tonumber(ms) + 1)
    redis.call('XADD', stream, 'MAXLEN', '0', id, 'f', '1')
  end
  redis.call('PEXPIRE', stream, ttl)
  return {2, id}
end
