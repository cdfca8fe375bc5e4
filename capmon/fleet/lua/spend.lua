-- SPEND: one transient retry from the fleet's retry budget (capmon/core/limiter.py, Budget.try_spend).
-- KEYS: 1 retry budget   ARGV: 1 budget start
-- Returns {1 spent | 0 refused, balance}.
local balance = num(redis.call('HGET', KEYS[1], 'balance'), tonumber(ARGV[1]))
if balance >= 1.0 - 1e-9 then
  balance = math.max(0.0, balance - 1.0)
  redis.call('HSET', KEYS[1], 'balance', balance)
  return {1, tostring(balance)}
end
return {0, tostring(balance)}
