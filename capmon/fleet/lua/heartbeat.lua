-- HEARTBEAT: register this process (with a TTL), renew its live leases and the probe
-- it owns, and list the fleet's live processes, in one round trip.
-- KEYS: 1 the registry (zset: process id -> expiry), 2 this process's hash, 3 the namespace's meta hash
-- ARGV: 1 process id, 2 ttl (s), 3 fields (JSON), 4 leases (JSON: {leases key: [ids]}),
--       5 lease ttl (s), 6 probes (JSON: {target hash key: true}), 7 key prefix (namespace .. ':proc:'),
--       8 a run token for a fresh namespace
-- Returns {now, fresh (1: the namespace was empty), [process hashes...]}.
local now = now_s()
local ttl = tonumber(ARGV[2])
local fields = cjson.decode(ARGV[3])
fields.seen = f6(now)
save(KEYS[2], fields)
redis.call('PEXPIRE', KEYS[2], math.floor(ttl * 1000))
redis.call('ZADD', KEYS[1], f6(now + ttl), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', f6(now))
local expiry = f6(now + tonumber(ARGV[5]))
for key, ids in pairs(cjson.decode(ARGV[4])) do
  for _, id in ipairs(ids) do redis.call('ZADD', key, 'XX', expiry, id) end
end
for key, _ in pairs(cjson.decode(ARGV[6])) do
  if redis.call('HGET', key, 'probe_owner') == ARGV[1] and redis.call('HGET', key, 'state') == 'half-open' then
    redis.call('HSET', key, 'probe_until', expiry)
  end
end
local fresh = 0
if redis.call('HSETNX', KEYS[3], 'run', ARGV[8]) == 1 then fresh = 1 end
local procs = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], f6(now), '+inf')) do
  local p = redis.call('HGETALL', ARGV[7] .. id)
  if #p > 0 then
    p[#p + 1] = 'id'
    p[#p + 1] = id
    procs[#procs + 1] = p
  end
end
return {f6(now), fresh, procs}
