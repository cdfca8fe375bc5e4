-- ADMIT: one attempt's admission on one target, fleet-wide, in one round trip:
-- breaker state, the key, quota parking, a server's not-before, the concurrency limit
-- over every process's leases, the rpm / tpm buckets; then the lease.
-- KEYS: 1 target hash, 2 its leases (zset: lease id -> expiry), 3 the key's hash,
--       4 rpm bucket, 5 tpm bucket, 6 retry budget, 7 events channel, 8 processes waiting for a slot
-- ARGV: 1 lease id, 2 lease ttl, 3 cost (tokens), 4 rpm (0: none), 5 tpm (0: none),
--       6 ramp_start, 7 ramp_duration, 8 retry budget earned since the last call,
--       9 budget cap, 10 budget start, 11 origin, 12 a pending transition (JSON) or ''
-- Returns {verdict, now, leases, retry_at, budget, cas, key state (lib.lua, key_state), hash..., budget version};
-- verdict: ok | full | state | disabled | parked | hint | rpm | tpm | missing.
local now = now_s()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', f6(now)} end

local b = redis.call('HMGET', KEYS[6], 'balance', 'ver')
local balance, bver = math.max(0, math.min(tonumber(ARGV[9]), num(b[1], tonumber(ARGV[10])))), num(b[2], 0)
local earned = tonumber(ARGV[8])
if earned > 0 then
  balance = math.min(tonumber(ARGV[9]), balance + earned)
  bver = redis.call('HINCRBY', KEYS[6], 'ver', 1)
  redis.call('HSET', KEYS[6], 'balance', balance)
end

local h = load(KEYS[1])
local cas = ''
if ARGV[12] ~= '' then cas, h = transition(KEYS[1], KEYS[7], h, cjson.decode(ARGV[12]), now, ARGV[11]) end

local count = live_leases(KEYS[2], now, tonumber(ARGV[2]))
local disabled = redis.call('HGET', KEYS[3], 'disabled')
local verdict, retry_at = 'ok', 0

local function bucket(key, rate)
  local v = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = num(v[1], rate), num(v[2], now)
  -- what no take or refund leaves (more than full, a debt beyond one request at the
  -- whole rate, a time to come) is garbage: the bucket starts full again
  if tokens > rate or tokens < -rate * 1000 or at > now + 1 then tokens, at = rate, now end
  if now > at then tokens = math.min(rate, tokens + (now - at) * rate / 60.0) end
  return tokens
end

-- When `amount` is there (capmon/core/control/limiter.py, TokenBucket.available_at).
local function ready(tokens, rate, amount)
  local need = math.min(amount, rate)
  if tokens >= need - 1e-9 * math.max(1.0, need) then return now end
  return now + (need - tokens) / (rate / 60.0)
end

local function take(key, tokens, amount)
  redis.call('HSET', key, 'tokens', tokens - amount, 'at', f6(now))
  redis.call('PEXPIRE', key, 120000)  -- a bucket left alone for two minutes is full again
end

-- capmon/core/control/decisions.py, admit: the gates (gate), then a free slot (slots), then
-- the buckets, in this order, so that both stores give the same verdict.
local share = 0.0
if h.state == 'ramp' then
  share = ramp_share_now(h, now, tonumber(ARGV[6]), tonumber(ARGV[7]))
elseif admits(h.state) then
  share = 1.0
end
if share <= 0 then
  verdict = 'state'
elseif disabled then
  verdict = 'disabled'
elseif num(h.park_until, 0) > now then
  verdict, retry_at = 'parked', num(h.park_until, 0)
elseif num(h.not_before, 0) > now then
  verdict, retry_at = 'hint', num(h.not_before, 0)
else
  local limit = num(h.limit, 1)
  local cap = limit
  -- a share is a sum of slots' worths: its rounding must not cost a slot (decisions._SLOT_EPS)
  if share < 1.0 then cap = math.min(limit, math.max(1, math.ceil(share * math.max(1.0, limit) - 1e-9))) end
  if count >= math.floor(cap + 1e-9) then
    verdict = 'full'
    redis.call('ZADD', KEYS[8], 'NX', f6(now), ARGV[11])  -- a release wakes the process that waited longest
  else
    local rpm, tpm, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[3])
    local rpm_tokens, tpm_tokens
    if rpm > 0 then
      rpm_tokens = bucket(KEYS[4], rpm)
      local at = ready(rpm_tokens, rpm, 1)
      if at > now then verdict, retry_at = 'rpm', at end
    end
    if verdict == 'ok' and tpm > 0 then
      tpm_tokens = bucket(KEYS[5], tpm)
      local at = ready(tpm_tokens, tpm, cost)
      if at > now then verdict, retry_at = 'tpm', at end
    end
    if verdict == 'ok' then
      if rpm > 0 then take(KEYS[4], rpm_tokens, 1) end
      if tpm > 0 then take(KEYS[5], tpm_tokens, cost) end
      redis.call('ZADD', KEYS[2], f6(now + tonumber(ARGV[2])), ARGV[1])
      count = count + 1
    end
  end
end
return {verdict, f6(now), count, f6(retry_at), f6(balance), cas, key_state(KEYS[3]), flat(h), bver}
