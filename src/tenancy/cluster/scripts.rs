//! The Lua scripts that keep shared limits atomic on the Redis server.
//!
//! Each runs as one step on the server (EVALSHA through [`redis::Script`],
//! which loads it again after a Redis restart), with the server's clock
//! (`TIME`), so replicas with skewed clocks still agree. They implement the
//! same algorithms as the local limiters, so a limit means the same with or
//! without Redis:
//!
//! - **concurrency**: a sorted set of slot ids scored by lease expiry; expired
//!   leases are dropped before counting, so a dead replica's slots free by
//!   themselves. Live replicas renew theirs on every heartbeat.
//! - **requests per minute**: GCRA with burst = the limit, as governor does
//!   locally: one key holding the theoretical arrival time.
//! - **tokens per minute**: the settle-able token bucket of
//!   `tenancy/bucket.rs` (continuous refill, may go into debt): a hash of
//!   `tokens` and `at`.

use std::sync::LazyLock;

use redis::Script;

/// Server time in milliseconds (fractional), the first lines of every script.
macro_rules! now_ms {
    () => {
        "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000\n"
    };
}

/// KEYS[1] slot set; ARGV max, lease ms, slot id.
/// Returns {1, held} when claimed, {0, held} when full.
pub static CLAIM_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then return {0, held} end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 2))
return {1, held + 1}
"
    ))
});

/// KEYS[1] token bucket, KEYS[2] GCRA arrival time; ARGV tokens per minute
/// (0: no limit), estimate, requests per minute (0: no limit).
/// Returns {1, tokens left, requests left}, {2, wait ms} (tokens) or
/// {3, wait ms} (requests). A refusal writes nothing.
pub static CHARGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local cap = tonumber(ARGV[1])
local est = tonumber(ARGV[2])
local rpm = tonumber(ARGV[3])
local tokens, tokens_left, requests_left = 0, -1, -1
if cap > 0 then
  local per_ms = cap / 60000
  local h = redis.call('HMGET', KEYS[1], 'tokens', 'at')
  tokens = tonumber(h[1]) or cap
  local at = tonumber(h[2]) or now
  if now > at then tokens = math.min(cap, tokens + (now - at) * per_ms) end
  local need = math.min(est, cap)
  if tokens + 1e-9 < need then return {2, math.ceil((need - tokens) / per_ms)} end
  tokens = tokens - est
  tokens_left = math.max(0, math.floor(tokens))
end
if rpm > 0 then
  local gap = 60000 / rpm
  local tat = math.max(tonumber(redis.call('GET', KEYS[2])) or now, now) + gap
  local allow_at = tat - gap * rpm
  if allow_at > now then return {3, math.ceil(allow_at - now)} end
  redis.call('SET', KEYS[2], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
  requests_left = math.floor((now - allow_at) / gap + 1e-9)
end
if cap > 0 then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) / (cap / 60000)) + 1000)
end
return {1, tokens_left, requests_left}
"
    ))
});

/// KEYS[1] token bucket; ARGV tokens per minute, refund (negative: a debt).
pub static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local cap = tonumber(ARGV[1])
local per_ms = cap / 60000
local h = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(h[1]) or cap
local at = tonumber(h[2]) or now
if now > at then tokens = math.min(cap, tokens + (now - at) * per_ms) end
tokens = math.min(cap, tokens + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(math.max(now, at)))
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) / per_ms) + 1000)
return 1
"
    ))
});

/// KEYS[1] replica set, KEYS[2..] slot sets; ARGV replica id, replica TTL
/// ms, slot lease ms, then one slot id per slot set. Renews this replica
/// and every slot it still holds (`XX`: a slot already expired and given
/// away is not taken back). Returns the replicas alive.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local ttl = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 2))
for i = 2, #KEYS do
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', now + lease, ARGV[i + 2]) == 1 then
    redis.call('PEXPIRE', KEYS[i], math.ceil(lease * 2))
  end
end
return redis.call('ZCARD', KEYS[1])
"
    ))
});
