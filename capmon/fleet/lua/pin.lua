-- PIN: a model pinned by hand for the whole fleet ('' goes back to automatic).
-- KEYS: 1 the pin, 2 events channel   ARGV: 1 model or '', 2 origin
if ARGV[1] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('PUBLISH', KEYS[2], cjson.encode({k = 'pin', model = ARGV[1], origin = ARGV[2]}))
return 1
