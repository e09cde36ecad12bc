"""The atomic Lua scripts of the Redis admission backend: concurrency leases and GCRA buckets.

Each script runs as one Redis command (EVALSHA through redis-py's ``Script``, which reloads a script that a
restarted server forgot), so a decision never races another replica: there is no check-then-increment
window. Time is the server's (``TIME`` inside the script), never a replica's clock. Redis ≥ 5 replicates
scripts by their effects, which is what allows ``TIME`` before a write.

**Leases.** A tenant's leases are one sorted set: member = lease id (``replica:n``), score = expiry in
server milliseconds. Every script first drops expired members, so the slots of a crashed replica come back
``lease_ttl`` after its last renewal. The tenant's limit lives in one hash shared by all replicas; a
replica passes its own idea of the limit only as the value to seed when the hash has none (a fresh or
restarted server).

**GCRA.** The arithmetic of gateway/gcra.py, line for line, on TATs kept in server microseconds: with
``T = 1e6 / rate`` and ``tau = max(T * burst, qty * T)``, ``new_tat = max(tat, now) + qty * T`` is allowed
iff ``new_tat - tau <= now``. All buckets of a request are checked before any is charged (one script), so a
deferral spends nothing. A bucket key expires (a second after) its bucket is full again. Rate and burst come
from the caller (every replica holds the same envelope configs, kept in one hash: SET_ENVELOPE). Numbers
come back as strings: Redis truncates Lua numbers to integers.

**Both at once.** A request with rate envelopes needs a charge and then a lease; ``CHARGE_ACQUIRE`` does the
two in one script (one round trip, the gateway's fast path): the charge first, the lease only if the charge
was granted. It is built from the same Lua functions as ``GCRA`` and ``ACQUIRE`` (``_GCRA_FN``,
``_ACQUIRE_FN``), so each algorithm is written once.
"""

from __future__ import annotations

# The scripts below are put together from these pieces, so that each algorithm is written once: CHARGE_ACQUIRE
# runs the same GCRA and lease code as GCRA and ACQUIRE do on their own.

# Server time, read once per script: ``now_ms`` for leases, ``now_us`` for GCRA TATs.
_CLOCK = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1e6 + tonumber(t[2])
"""

# acquire(leases zset, limits hash, tenant, lease id, ttl ms, limit to seed when none is stored, now ms)
# returns {granted 0|1, holders after the decision, limit, expired leases dropped}.
_ACQUIRE_FN = """
local function acquire(zset, limits, tenant, lid, ttl, seed, now)
  local dropped = redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  local limit = tonumber(redis.call('HGET', limits, tenant))
  if limit == nil then
    limit = tonumber(seed)
    redis.call('HSET', limits, tenant, limit)
  end
  local n = redis.call('ZCARD', zset)
  if n < limit then
    redis.call('ZADD', zset, now + tonumber(ttl), lid)
    return {1, n + 1, limit, dropped}
  end
  return {0, n, limit, dropped}
end
"""

# KEYS: leases zset, limits hash. ARGV: tenant, lease id, ttl ms, limit to seed when none is stored.
# Returns acquire()'s answer.
ACQUIRE = _CLOCK + _ACQUIRE_FN + """
return acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now_ms)
"""

# KEYS: leases zset. ARGV: lease id. Returns 1 when the lease was held, 0 when it was gone already.
RELEASE = """
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# KEYS: leases zset. ARGV: ttl ms, lease ids... Extends every lease this replica still runs; a lease that is
# missing (expired while the replica stalled, or a server that restarted empty) is added back, because its
# request still occupies the backend. Returns how many were added back.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = now + tonumber(ARGV[1])
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], exp, ARGV[i])
end
return added
"""

# KEYS: limits hash. ARGV: tenant, limit. Returns the previous limit (or -1).
SET_LIMIT = """
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or -1
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return old
"""

# KEYS: leases zsets of every tenant..., then the limits hash. ARGV: tenant names in the same order.
# Returns {expired dropped in all, holders_1, limit_1 (or -1), holders_2, limit_2, ...}.
READ = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {0}
for i = 1, #ARGV do
  out[1] = out[1] + redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  out[#out + 1] = redis.call('ZCARD', KEYS[i])
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[#KEYS], ARGV[i])) or -1
end
return out
"""

# gcra(keys, argv, now us) with keys: n bucket keys, then one backoff key per envelope involved; argv: mode
# ("spend" | "peek" | "refund" | "force" | "read"), n, then rate, burst, qty per bucket. "spend" charges every
# bucket or none; when it defers, every backoff key is pushed to now + the wait (never earlier than it was).
# "force" charges every bucket whatever it holds (max(tat, now) + qty * T, beyond the burst if need be: work
# that already ran, gcra.py's force); its qty is signed, and a negative one is given back as "refund" does,
# so a settle of either sign is one call. "read" charges nothing and ignores qty.
# Returns {allowed 0|1, index of the bucket that defers (1-based, 0 if none), retry after s,
#          per bucket: seconds its TAT is ahead of now (the debt; remaining = burst - ahead * rate),
#          per backoff key: seconds of backoff left}.
_GCRA_FN = """
local function gcra(keys, argv, now)
  local mode = argv[1]
  local n = tonumber(argv[2])
  local tats = {}
  local new = {}
  local worst, worst_i = -1, 0
  for i = 1, n do
    local rate = tonumber(argv[3 * i])
    local burst = tonumber(argv[3 * i + 1])
    local qty = tonumber(argv[3 * i + 2])
    local v = redis.call('GET', keys[i])
    local tat = v and tonumber(v) or now
    tats[i] = tat
    local T = 1e6 / rate
    if mode == 'refund' or (mode == 'force' and qty < 0) then
      new[i] = math.max(now, tat - math.abs(qty) * T)
    elseif mode == 'force' then
      new[i] = math.max(tat, now) + qty * T
    elseif mode ~= 'read' then
      local tau = math.max(T * burst, qty * T)
      new[i] = math.max(tat, now) + qty * T
      local allow_at = new[i] - tau
      if allow_at > now and allow_at - now > worst then
        worst, worst_i = allow_at - now, i
      end
    end
  end
  local allowed = worst < 0 and 1 or 0
  local write = (allowed == 1 and mode == 'spend') or mode == 'refund' or mode == 'force'
  local out = {allowed, worst_i, string.format('%.6f', math.max(worst, 0) / 1e6)}
  for i = 1, n do
    local tat = tats[i]
    if write then
      tat = new[i]
      redis.call('SET', keys[i], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
    end
    out[#out + 1] = string.format('%.6f', math.max(0, tat - now) / 1e6)
  end
  for i = n + 1, #keys do
    local v = redis.call('GET', keys[i])
    local until_ = v and tonumber(v) or 0
    if mode == 'spend' and allowed == 0 and now + worst > until_ then
      until_ = now + worst
      redis.call('SET', keys[i], string.format('%.3f', until_), 'PX', math.ceil(worst / 1000) + 1)
    end
    out[#out + 1] = string.format('%.6f', math.max(0, until_ - now) / 1e6)
  end
  return out
end
"""

# KEYS and ARGV: gcra()'s keys and argv. Returns gcra()'s answer.
GCRA = _CLOCK + _GCRA_FN + """
return gcra(KEYS, ARGV, now_us)
"""

# The fast path of a request with rate envelopes, one round trip instead of two: charge the envelopes
# (gcra() "spend") and, only when the charge is granted, try the lease (acquire()), on one reading of the
# server clock. An envelope that defers takes no lease, as when the scripts ran one after the other.
# KEYS: leases zset, limits hash, then gcra()'s keys. ARGV: ACQUIRE's four, then gcra()'s argv.
# Returns {gcra()'s answer, acquire()'s answer or {} when the charge deferred}.
CHARGE_ACQUIRE = _CLOCK + _ACQUIRE_FN + _GCRA_FN + """
local gkeys, gargv = {}, {}
for i = 3, #KEYS do gkeys[#gkeys + 1] = KEYS[i] end
for i = 5, #ARGV do gargv[#gargv + 1] = ARGV[i] end
local charged = gcra(gkeys, gargv, now_us)
if charged[1] ~= 1 then
  return {charged, {}}
end
return {charged, acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now_ms)}
"""

# KEYS: envelope config hash, requests bucket, tokens bucket, backoff key. ARGV: field (tenant/target), the
# config as JSON ("" = remove the envelope), then rate and burst of the requests and the tokens bucket (0 =
# the envelope has no such bucket). A new config keeps each bucket's debt in units, capped to one new burst
# (gcra.py's reconfigure: debt = ahead * old rate, tat = now + min(debt, burst) / rate), so a raise applies
# at once and a cut never leaves more than its burst; the old rates (and bursts, for "unchanged") are read
# from the old config JSON. A bucket whose old rate is unknown (no old config, "null", or one without that
# unit) keeps its debt in time, capped to one new burst, as before. A bucket the config drops, and a removed
# envelope's state, are deleted, so an envelope added again starts full, as in process. A removal is kept
# as "null" so that a restarted replica does not seed it again from its file. Returns the previous JSON
# ("" if none).
SET_ENVELOPE = """
local old = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if ARGV[2] == '' then
  redis.call('HSET', KEYS[1], ARGV[1], 'null')
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return old
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local prev = nil
if old ~= '' and old ~= 'null' then
  local ok, decoded = pcall(cjson.decode, old)
  if ok and type(decoded) == 'table' then
    prev = decoded
  end
end
local names = {{'requests_per_s', 'request_burst'}, {'tokens_per_s', 'token_burst'}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1e6 + tonumber(t[2])
for i = 1, 2 do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  if rate <= 0 then
    redis.call('DEL', KEYS[i + 1])
  else
    local v = redis.call('GET', KEYS[i + 1])
    local tat = v and tonumber(v) or nil  -- nil: no bucket (full), or a value that is not a number
    local orate = prev and tonumber(prev[names[i][1]])
    local write = tat ~= nil
    if write and orate and orate > 0 then
      local oburst = tonumber(prev[names[i][2]]) or math.max(1, math.ceil(orate))
      write = orate ~= rate or oburst ~= burst  -- the same parameters change nothing
      local debt = math.max(0, tat - now) * orate / 1e6  -- units
      tat = now + math.min(debt, burst) * 1e6 / rate
    elseif write then
      tat = math.min(math.max(tat, now), now + burst * 1e6 / rate)
    end
    if write then
      redis.call('SET', KEYS[i + 1], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
    end
  end
end
return old
"""
