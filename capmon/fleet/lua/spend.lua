-- SPEND: one transient retry from the fleet's retry budget (capmon/core/control/limiter.py, Budget.try_spend).
-- KEYS: 1 retry budget   ARGV: 1 budget start
-- Returns {1 spent | 0 refused, balance, version (every write adds one)}.
local b = redis.call('HMGET', KEYS[1], 'balance', 'ver')
local balance = num(b[1], tonumber(ARGV[1]))
if balance >= 1.0 - 1e-9 then
  balance = math.max(0.0, balance - 1.0)
  redis.call('HSET', KEYS[1], 'balance', balance)
  return {1, tostring(balance), redis.call('HINCRBY', KEYS[1], 'ver', 1)}
end
return {0, tostring(balance), num(b[2], 0)}
