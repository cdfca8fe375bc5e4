-- BEGIN_PROBE: one probe for the whole fleet while a breaker is open. OPEN ->
-- HALF_OPEN for exactly one caller, when the probe is due; also when a HALF_OPEN
-- probe's owner went silent (its heartbeat stopped renewing probe_until).
-- KEYS: 1 target hash, 2 its leases, 3 events channel
-- ARGV: 1 the generation the caller last agreed with, 2 owner (process id), 3 seconds the
--       probe may go unrenewed, 4 lease id, 5 lease ttl, 6 early ('1': the caller's demand
--       makes a probe due before the schedule, capmon/core/control/demand.py), 7 the floor between
--       probes (seconds, for an early one)
-- An early probe goes when no server's hint holds the target (hint_until, written by
-- SETTLE) and the fleet's last probe began at least the floor ago (probe_at).
-- Returns {ok | refused | missing, now, hash...}.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', f6(now)} end
local h = load(KEYS[1])
local why = nil
local interval = string.format('%g', num(h.interval, 0))
local current = h.state == 'open' and num(h.gen, 0) == tonumber(ARGV[1])
if current and num(h.next_probe, 0) <= now + 0.005 then
  why = 'probing (interval ' .. interval .. 's)'
elseif current and ARGV[6] == '1' and num(h.hint_until, 0) <= now
    and num(h.probe_at, 0) + (tonumber(ARGV[7]) or 0) <= now + 0.005 then
  why = 'probing (on demand)'
elseif h.state == 'half-open' and num(h.probe_until, 0) < now then
  why = 'probing (interval ' .. interval .. 's), taking over from a silent prober'
end
if why == nil then return {'refused', f6(now), flat(h)} end
h = commit(KEYS[1], h, {state = 'half-open', gen = num(h.gen, 0) + 1, reason = why, probe_owner = ARGV[2],
                     probe_until = f6(now + tonumber(ARGV[3])), next_probe = 0, streak = 0, streak_hint = '',
                     probe_at = f6(now)}, ARGV[2])
live_leases(KEYS[2], now, tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], f6(now + tonumber(ARGV[5])), ARGV[4])
publish(KEYS[3], 'b', h)
return {'ok', f6(now), flat(h)}
