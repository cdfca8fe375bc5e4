-- SETTLE: one attempt's outcome on one target, fleet-wide, in one round trip: the
-- lease back, the limiter's learning, the breaker's evidence and a pending move of
-- the local breaker (compare-and-set), the key action, a server's not-before, the tpm
-- refund, and news of a free slot for processes whose admission was refused.
-- What needs no count arrives decided (capmon/core/control/decisions.py, plan_settle: the
-- signals, the cleaned hint, the key's move, how long a hint may block, the refunds);
-- this script decides what needs the fleet's counts, by the functions named below.
-- KEYS: 1 target hash, 2 its leases, 3 the key's hash, 4 tpm bucket, 5 events channel,
--       6 processes waiting for a slot (zset: process id -> since), 7 rpm bucket
-- ARGV: 1 lease id, 2 limiter signal (ok | overload | neutral), 3 position, 4 epoch,
--       5 breaker signal (success | capacity | down | silent | transient | neutral), 6 the admission's generation,
--       7 seconds since it was sent, 8 hint (-1: none), 9 probe (0/1), 10 key action (none | disable | park),
--       11 key reason, 12 park seconds, 13 seconds a hint blocks the target (-1: none), 14 tokens to refund, 15 tpm,
--       16 limiter min, 17 limiter max, 18 limiter decrease, 19 failure_threshold, 20 probe_interval,
--       21 cooldown_multiplier, 22 cooldown, 23 cooldown_max, 24 origin, 25 a pending transition (JSON) or '',
--       26 the registry's key prefix (namespace .. ':proc:'), 27 rpm, 28 refund the rpm token (1: given
--       back before anything was sent), 29 lease ttl, 30 the limiter's initial limit, 31 pressed (1: the
--       sender's work was turned away for want of room while this was out), 32 seconds a refusal took
--       (-1: not a refusal; capmon/core/control/survival.py, is_refusal)
-- Returns {status, now, news (0/1), cas, key state (lib.lua, key_state), hash...}; status: ok | missing.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', f6(now)} end
local channel, origin = KEYS[5], ARGV[24]
local h = load(KEYS[1])
local w = {}

local held = live_leases(KEYS[2], now, tonumber(ARGV[29]))
local present = redis.call('ZREM', KEYS[2], ARGV[1])
local busy = held + 1 - present  -- our requests in flight there, this one included (an expired lease counts too)
local left = held - present

-- ------------------------------------------------------------ the limiter
-- The same learning as capmon/core/control/limiter.py (AdaptiveLimiter.release, _grow, _cut,
-- checkpoint): change both or neither; tests/fleet/test_limiter_math.py drives both.
-- limiter.py's SLOW_START_STEP, _FIRST_HOLD, MAX_HOLD, _CLIMB
local STEP, FIRST_HOLD, MAX_HOLD, CLIMB = 2.0, 1.0, 4.0, 0.0
local lmin, lmax, decrease = tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
local limit, capacity = num(h.limit, 1), num(h.capacity, -1)
local epoch, hold, below = num(h.epoch, 0), num(h.hold, FIRST_HOLD), num(h.below, 0)
local ceiling = num(h.ceiling, 0)  -- what the target held before a drop, still worth asking for (0: none)
local position, slot_epoch = tonumber(ARGV[3]), tonumber(ARGV[4])
local lsig, probe = ARGV[2], ARGV[9] == '1'
local news = false
local streak = num(h.streak, 0)
local bsig = ARGV[5]
local checkpoint, keep = false, false
if not probe then
  local is_news = lsig == 'overload' and slot_epoch == epoch  -- decisions.overload_is_news
  -- decisions.starts_streak: a failure streak may begin: remember what it may undo ...
  checkpoint = (bsig == 'down' or bsig == 'silent' or is_news) and admits(h.state) and streak == 0
  -- ... after this failure's lesson when it is the limiter's own (decisions.checkpoint_keeps_lesson)
  local known = capacity
  if known < 0 then known = tonumber(ARGV[30]) end  -- none learned yet: the limit it started from
  keep = checkpoint and is_news and math.max(lmin, position - 1) >= known
  if checkpoint and not keep then
    w.saved, w.s_limit, w.s_capacity, w.s_hold = 1, limit, capacity, hold
  end
  if lsig == 'ok' then
    below = 0
    if capacity >= 0 and position > capacity and slot_epoch == epoch then
      -- sent above the learned capacity since the last cut, and served: more room, climb
      capacity = position
      hold = CLIMB
      if capacity >= ceiling then ceiling = 0 end  -- back where it was: climb until a rejection
    end
    local pressed = ARGV[31] == '1'
    if capacity < 0 then
      -- slow start: two slots per answer while the limit is in use (or work was turned away)
      if busy >= limit / 2 or pressed then limit = math.min(lmax, limit + STEP) end
    elseif pressed then
      -- pressed (the full limit turned work away): a climb's two slots per answer, else
      -- one slot per hold round trips
      if hold <= CLIMB then
        limit = math.min(lmax, limit + STEP)
      else
        limit = math.min(lmax, limit + 1.0 / (limit * hold))
      end
    end
  elseif is_news then
    local kept = math.max(lmin, position - 1)
    local new
    if capacity >= 0 and kept >= capacity then
      -- a send above the capacity refused: it holds what was in flight
      if ceiling > kept then
        -- below what it held before a drop: ask again next round trip, half-way down to
        -- that ceiling (limiter.ceiling_after_refusal), forgotten once nothing is left
        hold = FIRST_HOLD
        ceiling = kept + math.floor((ceiling - kept) / 2)
        if ceiling <= kept then ceiling = 0 end
      else
        -- ask again twice as late
        ceiling = 0
        hold = math.min(MAX_HOLD, math.max(FIRST_HOLD, hold * 2.0))
      end
      new = kept
      capacity = kept
    else
      below = below + 1
      if below == 1 then new = kept else new = math.max(lmin, math.min(kept, limit * decrease)) end
      -- what it held before the drop: room that may come back (a recovery in steps)
      if capacity >= 0 then ceiling = math.max(ceiling, capacity) end
      capacity = math.max(lmin, math.floor(new))
      if ceiling > capacity then
        hold = FIRST_HOLD  -- ask for it back every round trip
      else
        ceiling = 0
        hold = math.max(FIRST_HOLD, hold)
      end
    end
    limit = math.max(lmin, math.min(new, lmax))
    epoch = epoch + 1
    w.cuts = num(h.cuts, 0) + 1
    news = true
  end
end
w.limit, w.capacity, w.epoch, w.hold, w.below, w.ceiling = limit, capacity, epoch, hold, below, ceiling
if keep then w.saved, w.s_limit, w.s_capacity, w.s_hold = 1, limit, capacity, hold end
-- the move below reads what was just learned (a trip restores the checkpoint)
for k, v in pairs(w) do h[k] = str(v) end

-- ------------------------------------------------------------ the breaker
local cas = ''
if ARGV[25] ~= '' then
  save(KEYS[1], w)
  w = {}
  cas, h = transition(KEYS[1], channel, h, cjson.decode(ARGV[25]), now, origin)
  streak = num(h.streak, 0)
end

local hint = tonumber(ARGV[8])
if hint < 0 then hint = nil end
if hint ~= nil then
  -- no probe on demand before a server's hint (BEGIN_PROBE), capped like every hint
  local until_ = now + math.min(hint, tonumber(ARGV[23]))
  if until_ > num(h.hint_until, 0) then w.hint_until = f6(until_) end
end
local state = h.state
-- Failures in a row counted across the fleet, in send order (CircuitBreaker._streak,
-- _success): every process counts its own evidence too, but a model that went down
-- shows it to all of them at once, and only the fleet's count trips it as fast as
-- one process would.
if not probe and tonumber(ARGV[6]) == num(h.gen, 0) and (state == 'closed' or state == 'ramp') then
  local sent = now - tonumber(ARGV[7])
  local failed = bsig == 'down' or bsig == 'silent' or (bsig == 'capacity' and news)
  if bsig == 'success' then
    if not (streak > 0 and sent < num(h.streak_from, 0)) then
      streak = 0
      w.streak, w.streak_hint = 0, ''
    end
  elseif failed then
    if streak == 0 then w.streak_from = f6(sent) end
    streak = streak + 1
    w.streak = streak
    local sh = num(h.streak_hint, nil)
    if hint ~= nil and (sh == nil or hint > sh) then sh = hint end
    if sh ~= nil then w.streak_hint = sh end
    -- a silent route trips at once (CircuitBreaker.record)
    if streak >= tonumber(ARGV[19]) or bsig == 'silent' then
      -- CircuitBreaker._trip
      local trips = num(h.trips, 0) + 1
      local first = tonumber(ARGV[20]) * tonumber(ARGV[21]) ^ (trips - 1)
      local interval = math.max(0.0, math.min(first, tonumber(ARGV[22])))
      local wait = interval
      if sh ~= nil then wait = math.max(interval, math.min(sh, tonumber(ARGV[23]))) end
      local why = streak .. ' capacity failures in a row across the fleet'
      if state == 'ramp' then why = streak .. ' capacity failures in a row during ramp, across the fleet' end
      if bsig == 'silent' then why = 'silent: no response headers in time' end
      w.state, w.gen, w.reason = 'open', num(h.gen, 0) + 1, why
      w.next_probe, w.interval, w.pfail, w.psucc = f6(now + wait), interval, 0, 0
      w.trips, w.total_trips = trips, num(h.total_trips, 0) + 1
      w.streak, w.streak_hint, w.probe_owner, w.probe_until = 0, '', '', 0
      restore(h, w)  -- decisions.trip_restores
      w.tripped = 1
    end
  end
end

-- a refusal's time, which every process's survival time goes by (RefusalTimes.refused)
local refused_in = tonumber(ARGV[32])
if refused_in >= 0 then w.refused_in, w.refusals = f6(refused_in), num(h.refusals, 0) + 1 end

-- ------------------------------------------------------------ key, hint, buckets
-- the key's move as decisions.plan_settle decided it (MemoryTarget.move_key)
local action, key_reason = ARGV[10], ARGV[11]
local gate = w.tripped ~= nil
w.tripped = nil
if action == 'disable' then
  redis.call('HSET', KEYS[3], 'disabled', key_reason)
  key_changed(KEYS[3])
  gate = true
elseif action == 'park' then
  w.park_until, w.park_reason = f6(now + tonumber(ARGV[12])), key_reason
  gate = true
end
local block_for = tonumber(ARGV[13])
if block_for >= 0 and left == 0 then
  -- decisions.not_before_after: a hint stops the whole target only when nobody's
  -- request is being served there (block_for is already capped at cooldown_max)
  local until_ = now + block_for
  if until_ > num(h.not_before, 0) then
    w.not_before = f6(until_)
    gate = true
  end
end
local function refund(key, rate, amount)
  if amount <= 0 or rate <= 0 then return end
  local v = redis.call('HMGET', key, 'tokens', 'at')
  if v[1] then
    local tokens, at = num(v[1], rate), num(v[2], now)
    if now > at then tokens = math.min(rate, tokens + (now - at) * rate / 60.0) end
    redis.call('HSET', key, 'tokens', math.min(rate, tokens + amount), 'at', f6(now))
  end
end
-- the refunds decisions.plan_settle decided (TokenBucket.refund)
refund(KEYS[4], tonumber(ARGV[15]), tonumber(ARGV[14]))
if ARGV[28] == '1' then refund(KEYS[7], tonumber(ARGV[27]), 1) end
h = commit(KEYS[1], h, w, origin)
local key = key_state(KEYS[3])
if gate then publish(channel, 'b', h, key_message(KEYS[3])) end
if not probe then
  for _ = 1, 3 do
    local waiter = redis.call('ZPOPMIN', KEYS[6])
    if #waiter == 0 then break end
    -- a process that died waiting is no longer registered: wake the next one
    if redis.call('EXISTS', ARGV[26] .. waiter[1]) == 1 then
      redis.call('PUBLISH', channel, cjson.encode({k = 'freed', id = h.id, to = waiter[1]}))
      break
    end
  end
end
local n = 0
if news then n = 1 end
return {'ok', f6(now), n, cas, key, flat(h)}
