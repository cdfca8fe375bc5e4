-- TRANSITION: a move of one process's breaker on its own (outside an admission or a
-- settle): what it decided while the store was unreachable, pushed when it rejoins.
-- KEYS: 1 target hash, 2 events channel
-- ARGV: 1 the transition (JSON), 2 origin
-- Returns {ok | conflict | missing, now, hash...}.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', f6(now)} end
local cas, h = transition(KEYS[1], KEYS[2], load(KEYS[1]), cjson.decode(ARGV[1]), now, ARGV[2])
return {cas, f6(now), flat(h)}
