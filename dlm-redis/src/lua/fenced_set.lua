-- Fenced write: store a value only for a fencing token not older than the stored one.
-- KEYS[1] the value's hash (fields 'value' and 'fence'); ARGV[1] token, ARGV[2] value
-- Returns {1, token} when written, {0, highest} when the token is stale.
local cur = tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1')
local t = tonumber(ARGV[1])
if t < cur then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1, t}
