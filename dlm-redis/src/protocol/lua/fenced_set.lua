-- Fenced write: store a value only for a fencing token not older than the stored one.
-- KEYS[1] the value's hash (fields 'value' and 'fence'); ARGV[1] token, ARGV[2] value
-- Returns {1, token} when written, {0, highest} when the token is stale; tokens as decimal
-- strings.
-- Tokens are 64-bit integers and Lua numbers are doubles (exact only below 2^53): they are
-- compared as decimal strings (no leading zeros: the longer one is larger, then the order
-- of the digits), never converted.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local cur = redis.call('HGET', KEYS[1], 'fence')
if cur and older(ARGV[1], cur) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1, ARGV[1]}
