//! The Lua scripts of the Redis state store: each is one atomic step on the server, whatever
//! the number of replicas. Keys and arguments are documented per script; `super` (the store)
//! builds them. Depends on nothing else in the crate.

use std::sync::LazyLock;

use ::redis::Script;

/// Drops up to 100 ids whose records expired from the namespace's indexes (KEYS[2] by write,
/// KEYS[3] by expiry), so the index of a namespace nobody lists stays bounded. ARGV[1]: the
/// record key prefix.
const PRUNE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do
  if redis.call('EXISTS', ARGV[1] .. id) == 0 then redis.call('ZREM', KEYS[2], id) end
  redis.call('ZREM', KEYS[3], id)
end
";

/// KEYS: record, index, expiries, sequence. ARGV: record key prefix, doc, ttl ms or "", id,
/// mode ("new" | "put" | the expected version). The new version, or 0 when nothing was written.
pub(super) static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRUNE}
local mode = ARGV[5]
if mode == 'new' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
elseif mode ~= 'put' then
  if redis.call('HGET', KEYS[1], 'v') ~= mode then return 0 end
end
local v = redis.call('INCR', KEYS[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', v, 'd', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
else
  redis.call('ZREM', KEYS[3], ARGV[4])
end
redis.call('ZADD', KEYS[2], v, ARGV[4])
return v
"
    ))
});

/// KEYS: record, index, expiries. ARGV: record key prefix, id. 1 if this call removed a live
/// record.
pub(super) static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRUNE}
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return redis.call('DEL', KEYS[1])
"
    ))
});

/// KEYS: index. ARGV: limit, record key prefix. Flat {id, version, doc, ...}, newest first;
/// ids whose record expired are pruned from the index.
pub(super) static LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local limit = tonumber(ARGV[1])
local out, stale, start, n = {}, {}, 0, 0
while n < limit do
  local ids = redis.call('ZREVRANGE', KEYS[1], start, start + 99)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local r = redis.call('HMGET', ARGV[2] .. id, 'v', 'd')
    if r[1] then
      out[#out + 1] = id; out[#out + 1] = r[1]; out[#out + 1] = r[2]
      n = n + 1
      if n >= limit then break end
    else
      stale[#stale + 1] = id
    end
  end
  start = start + #ids
end
for _, id in ipairs(stale) do redis.call('ZREM', KEYS[1], id) end
return out
",
    )
});

/// KEYS: counter. ARGV: delta, limit or "", ttl ms. {1, new} added or {0, current} over.
pub(super) static ADD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = redis.call('GET', KEYS[1])
local delta = tonumber(ARGV[1])
local c = 0
if cur then c = tonumber(cur) end
if delta > 0 and ARGV[2] ~= '' and c + delta > tonumber(ARGV[2]) then return {0, c} end
local n = c + delta
if n < 0 then n = 0 end
if cur then
  redis.call('SET', KEYS[1], n, 'KEEPTTL')
else
  redis.call('SET', KEYS[1], n, 'PX', ARGV[3])
end
return {1, n}
",
    )
});

/// KEYS: lease. ARGV: holder, ttl ms. 1 if taken or renewed.
pub(super) static LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local h = redis.call('GET', KEYS[1])
if h and h ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
",
    )
});

/// KEYS: lease. ARGV: holder.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
",
    )
});

/// KEYS: due zset, docs hash, attempts hash. ARGV: id, doc, due ms.
pub(super) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], 0)
return 0
",
    )
});

/// KEYS: due zset, docs hash, attempts hash. ARGV: now ms, now + lease ms, max.
/// Flat {id, doc, attempts before this claim, ...}, oldest due first.
pub(super) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  local doc = redis.call('HGET', KEYS[2], id)
  if doc then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    local a = redis.call('HINCRBY', KEYS[3], id, 1)
    out[#out + 1] = id; out[#out + 1] = doc; out[#out + 1] = a - 1
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
  end
end
return out
",
    )
});

/// KEYS: due zset. ARGV: id, due ms. Only an item still queued is moved.
pub(super) static RESCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
return 0
",
    )
});

/// KEYS: due zset, docs hash, attempts hash. ARGV: id.
pub(super) static ACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 0
",
    )
});

/// KEYS: bucket (its theoretical arrival time, µs, as a string). ARGV: interval µs, burst ×
/// interval µs (`tau`). {1, ahead} taken or {0, ahead} refused, where `ahead` is how far the
/// bucket's arrival time is past the server's now (the arithmetic of `gcra.rs`, made here so
/// it is atomic and on one clock). A taken bucket expires once full, so an idle one vanishes.
/// Numbers are formatted with `%d`: Lua's default would round a µs timestamp.
pub(super) static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local nxt = tat + interval
if nxt - now > tau then return {0, tat - now} end
redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX',
  string.format('%d', math.ceil((nxt - now) / 1000)))
return {1, nxt - now}
",
    )
});

/// Removes the expired slots of the semaphore KEYS[1] and keeps the key's own expiry at its
/// last slot's, so a semaphore nobody holds vanishes. Defines `now` (ms, the server's clock).
const SLOTS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local function keep_until_last()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(tonumber(last[2]) - now, 1)))
  end
end
";

/// KEYS: semaphore (sorted set holder → expiry ms). ARGV: holder, max, ttl ms. The slots now
/// held, or -1 when all `max` are held by others.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{SLOTS}
local n = redis.call('ZCARD', KEYS[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if n >= tonumber(ARGV[2]) then return -1 end
  n = n + 1
end
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[3])), ARGV[1])
keep_until_last()
return n
"
    ))
});

/// KEYS: semaphore. ARGV: holder. Removing the last slot removes the key.
pub(super) static RELINQUISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{SLOTS}
redis.call('ZREM', KEYS[1], ARGV[1])
keep_until_last()
return 0
"
    ))
});

/// KEYS: semaphore. The unexpired slots (read only: counted on the server's clock).
pub(super) static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
",
    )
});
