-- Acquire: the acquisition rule (take.lua, prepended). Fencing tokens are drawn later,
-- when read (fence.lua).
-- KEYS[1] lock key
-- ARGV[1] owner token, ARGV[2] ttl in ms
-- Returns {1, 0} acquired (or already ours), or what take.lua returns otherwise.
return take(function()
  return {1, 0}
end)
