-- capmon/fleet/lua/lib.lua: put in front of every capmon script (capmon/fleet/scripts.py).
-- All shared time is Redis's own (TIME), in seconds: machines' clocks differ, and a
-- process converts to its own clock from the `now` every script returns.

local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function f6(x)
  return string.format('%.6f', x)
end

-- A number read from Redis, or ``d``: garbage ("abc", and "nan", "inf" or hex, which
-- Lua's tonumber takes) never reaches the math. The process that reads the hash finds
-- the garbage too (capmon/fleet/codec.py) and repairs it.
local function num(v, d)
  if v == nil or v == false or v == '' then return d end
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return d end
  return n
end

-- Leases that count: expired ones go, and so do ones expiring further ahead than any
-- process sets (now + lease ttl, renewed by heartbeats), plus a slack for the time a
-- call takes: such an entry was forged or left by a clock that jumped, and would hold
-- a slot for ever. Returns how many are left.
local LEASE_SLACK = 1.0
local function live_leases(key, now, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', f6(now))
  redis.call('ZREMRANGEBYSCORE', key, '(' .. f6(now + ttl + LEASE_SLACK), '+inf')
  return redis.call('ZCARD', key)
end

local function load(key)
  local raw = redis.call('HGETALL', key)
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  return h
end

-- Numbers are stored as %.17g, which reads back as the very same double: what a
-- process mirrors from an answer is what the next script computes with.
local function str(v)
  if type(v) == 'number' then return string.format('%.17g', v) end
  return v
end

local function save(key, w)
  local flat = {}
  for k, v in pairs(w) do
    flat[#flat + 1] = k
    flat[#flat + 1] = str(v)
  end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
end

-- A key's state as scripts return and publish it: "<version>:<disabled reason>" (the
-- reason '' while the key is usable). Every change of ``disabled`` raises the key's
-- version (key_changed), so that a process takes a key's state only from a read no
-- older than the last it took (capmon/fleet/target.py, RedisTarget.apply_key): a
-- reconciliation or a message read before a settle disabled the key cannot undo it.
-- A message carries the two apart (``disabled``, ``kv``: key_message), so a process of
-- an older release still reads the reason it always read.
local function key_fields(key)
  local v = redis.call('HMGET', key, 'disabled', 'ver')
  return v[1] or '', string.format('%d', num(v[2], 0))
end

local function key_state(key)
  local reason, ver = key_fields(key)
  return ver .. ':' .. reason
end

local function key_message(key, extra)
  local reason, ver = key_fields(key)
  extra = extra or {}
  extra.disabled, extra.kv = reason, ver
  return extra
end

local function key_changed(key)
  redis.call('HINCRBY', key, 'ver', 1)
end

local function admits(state)
  return state == 'closed' or state == 'forced-closed' or state == 'ramp'
end

-- Write ``w`` into the hash ``h`` was read from, with a new version: readers apply a
-- hash only if its version is not older than the last one they applied. Returns the
-- hash as it is now.
local function commit(key, h, w, origin)
  w.origin = origin
  save(key, w)
  for k, v in pairs(w) do h[k] = str(v) end
  h.ver = tostring(redis.call('HINCRBY', key, 'ver', 1))
  return h
end

local function publish(channel, kind, h, extra)
  local msg = {k = kind, h = h}
  if extra then for k, v in pairs(extra) do msg[k] = v end end
  redis.call('PUBLISH', channel, cjson.encode(msg))
end

-- A hash as one JSON string: one bulk reply to parse, not seventy.
local function flat(h)
  return cjson.encode(h)
end

-- The ramp's share now: what clean rounds earned, or the time ceiling if higher
-- (capmon/core/control/breaker.py, ramp_share).
local function ramp_share_now(h, now, ramp_start, ramp_duration)
  if ramp_duration <= 0 then return 1.0 end
  local by_time = ramp_start + (1.0 - ramp_start) * (now - num(h.ramp_from, now)) / ramp_duration
  return math.min(1.0, math.max(num(h.ramp_share, ramp_start), by_time))
end

-- A trip restores what the limiter learned before the failure streak began: an
-- outage is not a capacity signal (capmon/core/control/limiter.py, AdaptiveLimiter.restore).
local function restore(h, w)
  if h.saved == '1' then
    w.limit, w.capacity, w.hold = num(h.s_limit, num(h.limit, 1)), num(h.s_capacity, -1), num(h.s_hold, 1.0)
    w.saved = 0
    w.epoch = num(h.epoch, 0) + 1
    w.below = 0
  end
end

-- A compare-and-set of a move one process's breaker made (capmon/core/control/breaker.py,
-- CircuitBreaker.export): it applies only if the shared generation is still the one
-- that process last agreed with, so a stale writer can never undo a newer move. A
-- ramp step keeps the generation and only raises the share.
local function transition(key, channel, h, tr, now, origin)
  if num(h.gen, 0) ~= tr.from then return 'conflict', h end
  if tr.step then
    if h.state ~= 'ramp' then return 'conflict', h end
    if tr.ramp_share > num(h.ramp_share, 0) then
      h = commit(key, h, {ramp_share = tr.ramp_share}, origin)
      publish(channel, 'b', h)
    end
    return 'ok', h
  end
  local w = {state = tr.state, gen = tr.gen, reason = tr.reason, interval = tr.interval, pfail = tr.pfail,
             psucc = tr.psucc, trips = tr.trips, total_trips = tr.total_trips, basis = tr.basis,
             ramp_share = tr.ramp_share, ramp_from = f6(now - tr.ramp_ago), streak = 0, streak_hint = '',
             probe_owner = '', probe_until = 0}
  if tr.next_in >= 0 then w.next_probe = f6(now + tr.next_in) else w.next_probe = 0 end
  -- decisions.trip_restores
  if tr.state == 'open' and (h.state == 'closed' or h.state == 'ramp') then restore(h, w) end
  h = commit(key, h, w, origin)
  publish(channel, 'b', h)
  return 'ok', h
end
