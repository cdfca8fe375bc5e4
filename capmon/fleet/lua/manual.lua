-- MANUAL: a person's trip, force-close or reset wins whatever the generation.
-- KEYS: 1 target hash, 2 the key's hash, 3 events channel
-- ARGV: 1 trip | force_close | reset, 2 reason, 3 origin, 4 probe_interval
-- Returns {ok | missing, now, key state (lib.lua, key_state), hash...}.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', f6(now)} end
local h = load(KEYS[1])
local states = {trip = 'forced-open', force_close = 'forced-closed', reset = 'closed'}
local w = {state = states[ARGV[1]], gen = num(h.gen, 0) + 1, reason = ARGV[2], next_probe = 0,
           interval = tonumber(ARGV[4]), pfail = 0, psucc = 0, streak = 0, streak_hint = '', probe_owner = '',
           probe_until = 0}
if ARGV[1] == 'reset' then
  -- a person judged the model healthy: forget the interval growth, the key's state and any hint
  w.trips, w.park_until, w.park_reason, w.not_before = 0, 0, '', 0
  redis.call('HDEL', KEYS[2], 'disabled')
  key_changed(KEYS[2])
end
h = commit(KEYS[1], h, w, ARGV[3])
local key = key_state(KEYS[2])
publish(KEYS[3], 'b', h, key_message(KEYS[2], {manual = 1}))
return {'ok', f6(now), key, flat(h)}
