-- SEED: a target's shared state, created from one process's mirror when Redis has
-- none (a new namespace, or a Redis restarted empty): whoever notices first seeds it,
-- the others find it there. Relative times keep an open breaker's probe schedule, so
-- a seeded breaker is never left stuck open.
-- KEYS: 1 target hash, 2 the key's hash, 3 events channel
-- ARGV: 1 fields (JSON; *_in are seconds from now, ramp_ago seconds ago), 2 the key's
--       disabled reason or '', 3 a fresh run token, 4 origin
-- Returns {seeded | exists, now, key state (lib.lua, key_state), hash...}.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', f6(now), key_state(KEYS[2]), flat(load(KEYS[1]))} end
local s = cjson.decode(ARGV[1])
local function at(x) if x == nil or x < 0 then return 0 end return f6(now + x) end
local w = {}
for k, v in pairs(s) do w[k] = v end
w.next_in, w.probe_in, w.park_in, w.not_before_in, w.ramp_ago = nil, nil, nil, nil, nil
w.next_probe, w.probe_until, w.park_until, w.not_before = at(s.next_in), at(s.probe_in), at(s.park_in), at(s.not_before_in)
w.ramp_from = f6(now - (s.ramp_ago or 0))
w.run, w.ver, w.streak, w.streak_hint, w.saved = ARGV[3], 0, 0, '', 0
if ARGV[2] ~= '' and redis.call('HSETNX', KEYS[2], 'disabled', ARGV[2]) == 1 then key_changed(KEYS[2]) end
local h = commit(KEYS[1], {}, w, ARGV[4])
publish(KEYS[3], 'b', h, key_message(KEYS[2]))
return {'seeded', f6(now), key_state(KEYS[2]), flat(h)}
