"""The atomic Lua scripts of the Redis admission backend: concurrency leases and GCRA buckets.

Each script runs as one Redis command (EVALSHA through redis-py's ``Script``, which reloads a script that a
restarted server forgot), so a decision never races another replica: there is no check-then-increment
window. Time is the server's (``TIME`` inside the script), never a replica's clock. Redis ≥ 5 replicates
scripts by their effects, which is what allows ``TIME`` before a write.

**Leases.** A tenant's leases are one sorted set: member = lease id (``replica:n``), score = expiry in
server milliseconds. Every script first drops expired members, so the slots of a crashed replica come back
``lease_ttl`` after its last renewal. The tenant's limit lives in one hash shared by all replicas; a
replica passes its own idea of the limit (its last good one) as the value to seed when the hash has none (a
fresh or restarted server), and as the value to use when the hash holds one that is not a limit.

**Stored values are checked, never coerced.** Lua's ``tonumber`` takes "nan", "1e400" or "2.5", and Redis
turns a NaN it returns into -9223372036854775808; so a limit or a version is used only when it is decimal
digits within its range (``count``, the same rule as gateway/config.py ``parse_count``). READ returns the
stored text as it is and the replica checks it; the scripts that must decide (ACQUIRE, the writes) refuse a
bad value, use the caller's last good one instead, and report what they refused.

**Admin writes** (WRITE_LIMITS, SET_ENVELOPE) are compare-and-set: each value is compared with the one
stored, only those that differ are written, and the same script numbers the change: the configuration
version (one key, one per change: a batch is one) and the version of each tenant changed (one hash), one
sequence for all replicas. Every read comes before the first write, so a script that fails on a key of the
wrong type has changed nothing.

**GCRA.** The arithmetic of core/gcra.py, line for line, on TATs kept in server microseconds: with
``T = 1e6 / rate`` and ``tau = max(T * burst, qty * T)``, ``new_tat = max(tat, now) + qty * T`` is allowed
iff ``new_tat - tau <= now``, tested on the debt (``max(tat - now, 0) + qty * T - tau <= 0``) so that no
rounding of the clock's magnitude defers a full bucket. All buckets of a request are checked before any is
charged (one script), so a deferral spends nothing. A bucket key expires (a second after) its bucket is full
again. Rate and burst come from the caller (every replica holds the same envelope configs, kept in one hash:
SET_ENVELOPE). Numbers come back as strings: Redis truncates Lua numbers to integers.

**Both at once.** A request with rate envelopes needs a charge and then a lease; ``CHARGE_ACQUIRE`` does the
two in one script (one round trip, the gateway's fast path): the charge first, the lease only if the charge
was granted. It is built from the same Lua functions as ``GCRA`` and ``ACQUIRE`` (``_GCRA_FN``,
``_ACQUIRE_FN``), so each algorithm is written once.

**Contracts** (gateway/redis/contracts.py). A tenant's contract envelope is one hash per tenant (``tat``, the
last classified time ``at``, a sequence number ``seq``) and ``CONTRACT`` classifies one arrival on it: core/
gcra.py's ``Gcra.spend`` line for line (``_CONTRACT_FN``), but in *seconds*, not microseconds, on doubles
written with 17 significant digits, so that Lua's IEEE arithmetic makes exactly the decisions core/
contract.py's ``classify`` makes on the same times (tested decision by decision): a contract's class is
replayed offline from the request log, which the rate envelopes' buckets never are. The time is the server's
``TIME`` in seconds, never earlier than the tenant's last classified one. On the gateway's path the
classification, the envelopes' charge and the lease are one script (``CONTRACT_ACQUIRE``, from the same
functions), so a contract adds no round trip to a request.
"""

from __future__ import annotations

from admit.gateway.config import LIMIT_MAX, VERSION_MAX

# The scripts below are put together from these pieces, so that each algorithm is written once: CHARGE_ACQUIRE
# runs the same GCRA and lease code as GCRA and ACQUIRE do on their own.

# Server time, read once per script: ``now_ms`` for leases, ``now_us`` for GCRA TATs.
_CLOCK = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1e6 + tonumber(t[2])
"""

# count(raw, max): a limit or version stored as text, as a number; nil when it is not decimal digits within
# max.
_COUNT_FN = f"""
local LIMIT_MAX, VERSION_MAX = {LIMIT_MAX}, {VERSION_MAX}
""" + """
local function count(raw, max)
  if type(raw) ~= 'string' or #raw == 0 or #raw > 16 or string.find(raw, '%D') then
    return nil
  end
  local v = tonumber(raw)
  if v > max then
    return nil
  end
  return v
end
"""

# For the writes. stored(raw, max, kind, where): count() of a value that may be missing (false: nil too),
# noting a refused one in `bad` as {kind, where, the value (100 characters at most)} for the caller to count
# and log. fmt(n): an integer as Redis should store it (never "1e+15").
_STORED_FN = _COUNT_FN + """
local bad = {}
local function stored(raw, max, kind, where)
  if not raw then
    return nil
  end
  local v = count(raw, max)
  if v == nil then
    bad[#bad + 1] = kind
    bad[#bad + 1] = where
    bad[#bad + 1] = string.sub(raw, 1, 100)
  end
  return v
end
local function fmt(n)
  return string.format('%d', n)
end
"""

# acquire(leases zset, limits hash, tenant, lease id, ttl ms, the caller's limit, now ms) returns {granted 0|1,
# holders after the decision, limit used, expired leases dropped[, the stored limit refused]}. The caller's
# limit (its last good one) is seeded when none is stored, and used when the stored one is not a limit
# (count()); that one is left as it is (an operator's to fix, or the next admin write's) and reported as a
# fifth element. The stored limit is usually the caller's own: then it needs no check (the request path's
# cost stays what it was).
_ACQUIRE_FN = """
local function acquire(zset, limits, tenant, lid, ttl, seed, now)
  local dropped = redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  local raw = redis.call('HGET', limits, tenant)
  local limit, refused = tonumber(seed), nil
  if not raw then
    redis.call('HSET', limits, tenant, seed)
  elseif raw ~= seed then
    local stored = count(raw, LIMIT_MAX)
    if stored == nil then
      refused = string.sub(raw, 1, 100)
    else
      limit = stored
    end
  end
  local n = redis.call('ZCARD', zset)
  if n < limit then
    redis.call('ZADD', zset, now + tonumber(ttl), lid)
    return {1, n + 1, limit, dropped, refused}
  end
  return {0, n, limit, dropped, refused}
end
"""

# KEYS: leases zset, limits hash. ARGV: tenant, lease id, ttl ms, the caller's limit (seed and fallback).
# Returns acquire()'s answer.
ACQUIRE = _CLOCK + _COUNT_FN + _ACQUIRE_FN + """
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

# The admin API's write of limits: compare-and-set (module docstring), one call per admin call.
# KEYS: limits hash, tenant versions hash, configuration version key. ARGV: the caller's configuration
# version, then per tenant: name, limit, the caller's version of that tenant. A stored version below the
# caller's (a server that lost its data) continues from the caller's, so no version is ever numbered twice; a
# stored value that is not a count is refused (reported) and counts as different from any limit.
# Returns {configuration version, per tenant {changed 0|1, old limit ('' if none), tenant version},
#          the refused values {kind, where, value, ...}}.
WRITE_LIMITS = _STORED_FN + """
local version = math.max(stored(redis.call('GET', KEYS[3]), VERSION_MAX, 'version', KEYS[3]) or 0,
                         tonumber(ARGV[1]))
local rows, any = {}, false
for i = 2, #ARGV, 3 do
  local tenant, new = ARGV[i], tonumber(ARGV[i + 1])
  local old = stored(redis.call('HGET', KEYS[1], tenant), LIMIT_MAX, 'limit', KEYS[1] .. ' ' .. tenant)
  local tv = stored(redis.call('HGET', KEYS[2], tenant), VERSION_MAX, 'version', KEYS[2] .. ' ' .. tenant)
  rows[#rows + 1] = {tenant = tenant, new = new, old = old, tv = math.max(tv or 0, tonumber(ARGV[i + 2])),
                     changed = old ~= new}
  any = any or old ~= new
end
if any then
  version = version + 1
  redis.call('SET', KEYS[3], fmt(version))
end
local out = {fmt(version)}
for _, row in ipairs(rows) do
  if row.changed then
    row.tv = row.tv + 1
    redis.call('HSET', KEYS[1], row.tenant, fmt(row.new))
    redis.call('HSET', KEYS[2], row.tenant, fmt(row.tv))
  end
  out[#out + 1] = {row.changed and 1 or 0, row.old and fmt(row.old) or '', fmt(row.tv)}
end
out[#out + 1] = bad
return out
"""

# KEYS: leases zsets of every tenant..., then the limits hash, the tenant versions hash, the configuration
# version key. ARGV: tenant names in the same order. Returns {expired dropped in all, configuration version,
# then per tenant: holders, limit, tenant version}, every stored value as the text Redis holds ('' if none):
# the replica checks them (module docstring).
READ = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #ARGV
local out = {0, redis.call('GET', KEYS[n + 3]) or ''}
for i = 1, n do
  out[1] = out[1] + redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  out[#out + 1] = redis.call('ZCARD', KEYS[i])
  out[#out + 1] = redis.call('HGET', KEYS[n + 1], ARGV[i]) or ''
  out[#out + 1] = redis.call('HGET', KEYS[n + 2], ARGV[i]) or ''
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
    local tat = v and tonumber(v)
    if not tat or tat ~= tat or math.abs(tat) == math.huge then
      tat = now  -- no bucket (full); or one that is not a finite number ("nan", "1e400"), read as full too
    end
    tats[i] = tat
    local T = 1e6 / rate
    if mode == 'refund' or (mode == 'force' and qty < 0) then
      new[i] = math.max(now, tat - math.abs(qty) * T)
    elseif mode == 'force' then
      new[i] = math.max(tat, now) + qty * T
    elseif mode ~= 'read' then
      local tau = math.max(T * burst, qty * T)
      new[i] = math.max(tat, now) + qty * T
      local wait = math.max(tat - now, 0) + qty * T - tau  -- on the debt, not the clock: no rounding defers
      if wait > 0 and wait > worst then
        worst, worst_i = wait, i
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
CHARGE_ACQUIRE = _CLOCK + _COUNT_FN + _ACQUIRE_FN + _GCRA_FN + """
local gkeys, gargv = {}, {}
for i = 3, #KEYS do gkeys[#gkeys + 1] = KEYS[i] end
for i = 5, #ARGV do gargv[#gargv + 1] = ARGV[i] end
local charged = gcra(gkeys, gargv, now_us)
if charged[1] ~= 1 then
  return {charged, {}}
end
return {charged, acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now_ms)}
"""

# The admin API's write of one envelope: compare-and-set (module docstring).
# KEYS: envelope config hash, requests bucket, tokens bucket, backoff key, tenant versions hash, configuration
# version key. ARGV: field (tenant/target), the config as JSON ("" = remove the envelope), rate and burst of
# the requests and the tokens bucket (0 = the envelope has no such bucket), then the tenant, the caller's
# configuration version and the caller's version of that tenant (as WRITE_LIMITS). The same JSON as stored
# (every replica writes it the same way: sorted keys, no spaces), or a removal of an envelope that is not
# there, changes nothing. A new config keeps each bucket's debt in units, capped to one new burst
# (gcra.py's reconfigure: debt = ahead * old rate, tat = now + min(debt, burst) / rate), so a raise applies
# at once and a cut never leaves more than its burst; the old rates (and bursts, for "unchanged") are read
# from the old config JSON. A bucket whose old rate is unknown (no old config, "null", or one without that
# unit) keeps its debt in time, capped to one new burst, as before. A bucket the config drops, and a removed
# envelope's state, are deleted, so an envelope added again starts full, as in process. A removal is kept
# as "null" so that a restarted replica does not seed it again from its file.
# Returns {changed 0|1, the previous JSON ("" if none), configuration version, tenant version, the refused
#          values {kind, where, value, ...}}.
SET_ENVELOPE = _STORED_FN + """
local old = redis.call('HGET', KEYS[1], ARGV[1]) or ''
local version = math.max(stored(redis.call('GET', KEYS[6]), VERSION_MAX, 'version', KEYS[6]) or 0,
                         tonumber(ARGV[8]))
local tv = math.max(stored(redis.call('HGET', KEYS[5], ARGV[7]), VERSION_MAX, 'version',
                           KEYS[5] .. ' ' .. ARGV[7]) or 0, tonumber(ARGV[9]))
local removing = ARGV[2] == ''
if ARGV[2] == old or (removing and (old == '' or old == 'null')) then
  return {0, old, fmt(version), fmt(tv), bad}
end
local tats = {}  -- read before any write (module docstring); nil: no bucket (full), or not a finite number
for i = 1, 2 do
  local v = redis.call('GET', KEYS[i + 1])
  local tat = v and tonumber(v)
  if tat and tat == tat and math.abs(tat) ~= math.huge then
    tats[i] = tat
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1e6 + tonumber(t[2])
version, tv = version + 1, tv + 1
redis.call('SET', KEYS[6], fmt(version))
redis.call('HSET', KEYS[5], ARGV[7], fmt(tv))
if removing then
  redis.call('HSET', KEYS[1], ARGV[1], 'null')
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return {1, old, fmt(version), fmt(tv), bad}
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
for i = 1, 2 do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  if rate <= 0 then
    redis.call('DEL', KEYS[i + 1])
  else
    local tat = tats[i]
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
return {1, old, fmt(version), fmt(tv), bad}
"""

# contract(key, mode, rate, burst, qty, now s) for one tenant's contract envelope, a hash {tat, at, seq}: core/
# gcra.py's spend in seconds, operation for operation (T = 1 / rate; tau = max(T * burst, qty * T); wait =
# max(tat - now, 0) + qty * T - tau; in contract iff wait <= 0, and then tat = max(tat, now) + qty / rate), so
# the decisions are core/contract.py's classify()'s on the same times (doubles stored with %.17g read back
# exactly). A missing tat is a full envelope (core's meter starts full at the first arrival, and a bucket whose
# tat is past decides as a full one), as is one that is not a finite number. ``now`` is never earlier than the
# tenant's last classified time (a server clock stepped back), so the times the log records are in
# classification order; ``seq`` numbers the classifications (ties of the clock's microsecond). "read" decides
# and writes nothing. The hash lives a day beyond the envelope's refill, so seq runs on across idle spells.
# Returns {in contract 0|1, the time classified (s), seq, seconds tat is ahead of that time (>= 0)}.
_CONTRACT_FN = """
local function f17(x)
  return string.format('%.17g', x)
end
local function contract(key, mode, rate, burst, qty, now)
  local st = redis.call('HMGET', key, 'tat', 'at', 'seq')
  local tat, at, seq = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if at and at == at and math.abs(at) ~= math.huge and at > now then
    now = at
  end
  if not tat or tat ~= tat or math.abs(tat) == math.huge then
    tat = now
  end
  if not seq or seq ~= seq or seq < 0 or seq > 1e15 then
    seq = 0
  end
  if mode == 'read' then
    return {0, f17(now), string.format('%d', seq), f17(math.max(tat - now, 0))}
  end
  local t = 1.0 / rate
  local tau = math.max(t * burst, qty * t)
  local wait = math.max(tat - now, 0.0) + qty * t - tau
  local allowed = 0
  if wait <= 0 then
    allowed = 1
    tat = math.max(tat, now) + qty / rate
  end
  seq = seq + 1
  redis.call('HSET', key, 'tat', f17(tat), 'at', f17(now), 'seq', string.format('%d', seq))
  redis.call('PEXPIRE', key, math.ceil(math.max(tat - now, 0) * 1000) + 86400000)
  return {allowed, f17(now), string.format('%d', seq), f17(math.max(tat - now, 0))}
end
"""

# KEYS: one contract hash per tenant. ARGV: mode ("classify": one key; "read": any number), then per key its
# contract's rate (units/s), burst (core's ceil, >= 1) and the request's cost (1, or its prompt + asked-for
# tokens; ignored by "read"). Time: the server's TIME in seconds (module docstring). Returns per key
# contract()'s answer.
CONTRACT = """
local t = redis.call('TIME')
local now_s = tonumber(t[1]) + tonumber(t[2]) / 1e6
""" + _CONTRACT_FN + """
local out = {}
for i = 1, #KEYS do
  out[i] = contract(KEYS[i], ARGV[1], tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]),
                    now_s)
end
return out
"""

# A request of a tenant with a contract, one round trip: classify it (contract(), always, on the same reading of
# the server clock as CONTRACT takes: the same decisions), then charge its rate envelopes if it has any (gcra()
# "spend"), and try the lease (acquire()) only when the charge is granted, as CHARGE_ACQUIRE does; the class is
# the caller's to pick the queue with when no slot is free. The contract's HMGET is the script's first command,
# so a broken contract key fails the script before anything is written. The answer is flat, and the class one
# string, because each element of a reply costs the caller's parser (redis-py's, in Python) more than the
# script's work costs Redis.
# KEYS: contract hash, leases zset, limits hash, then gcra()'s keys (none when no envelope matches). ARGV: the
# contract's rate, burst and the request's cost (as CONTRACT's "classify"), ACQUIRE's four, then gcra()'s argv
# (none when no envelope matches).
# Returns {contract()'s answer joined by spaces, gcra()'s answer (1 when no envelope), then acquire()'s answer's
# elements (none when the charge deferred)}.
CONTRACT_ACQUIRE = _CLOCK + _COUNT_FN + _ACQUIRE_FN + _GCRA_FN + _CONTRACT_FN + """
local now_s = tonumber(t[1]) + tonumber(t[2]) / 1e6
local classified = table.concat(contract(KEYS[1], 'classify', tonumber(ARGV[1]), tonumber(ARGV[2]),
                                         tonumber(ARGV[3]), now_s), ' ')
local charged = 1
if #KEYS > 3 then
  local gkeys, gargv = {}, {}
  for i = 4, #KEYS do gkeys[#gkeys + 1] = KEYS[i] end
  for i = 8, #ARGV do gargv[#gargv + 1] = ARGV[i] end
  charged = gcra(gkeys, gargv, now_us)
  if charged[1] ~= 1 then
    return {classified, charged}
  end
end
local a = acquire(KEYS[2], KEYS[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], now_ms)
return {classified, charged, a[1], a[2], a[3], a[4], a[5]}
"""
