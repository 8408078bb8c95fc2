-- Sliding-window rate limit for one key: the proportional two-window estimate, atomically.
--
-- The same state machine as `Window::check` in src/policy/ratelimit/mod.rs, on a Redis hash; keep
-- the two in step (tests/ratelimit_redis.rs runs both side by side and compares every
-- decision). See src/policy/ratelimit/mod.rs for the estimate and what it guarantees.
--
-- KEYS[1]  the limited key's state, a hash: w = window index, c = requests allowed in window
--          w, p = requests allowed in window w - 1. One key, so the script is cluster-safe
--          without hash tags, and the state is the same 3 numbers the local backend keeps.
-- ARGV[1]  N, requests allowed per window (integer >= 1)
-- ARGV[2]  W, the window in milliseconds (integer >= 1, N * W <= 2^53 so that every product
--          below is an exact integer in Lua's doubles)
-- ARGV[3]  optional: now, in milliseconds since the Unix epoch. Absent: the server's TIME,
--          one clock for every proxy replica (Redis >= 5 replicates scripts by effects, so
--          TIME before a write is allowed; in Redis 7 that is the only mode).
--
-- Returns {1, remaining} if the request is allowed (and counted), or {0, retry_after_ms} if it
-- is refused (and not counted: nothing is written).

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
if not limit or not window or not now or limit < 1 or window < 1 or now < 0 then
  return redis.error_reply('ERR sliding_window.lua: bad arguments')
end

local index = math.floor(now / window)
local offset = now - index * window

local state = redis.call('HMGET', key, 'w', 'c', 'p')
local stored = tonumber(state[1])
local current = tonumber(state[2]) or 0
local previous = tonumber(state[3]) or 0
if stored == nil or index > stored + 1 then
  -- New key, or nothing counted in the last two windows.
  current, previous = 0, 0
elseif index == stored + 1 then
  previous, current = current, 0
elseif index < stored then
  -- This caller's clock is behind the stored window (clock skew between replicas passing
  -- ARGV[3], or the server's clock stepped back): read the stored window at its start, where
  -- the previous window weighs most. The strictest reading.
  index, offset = stored, 0
end

-- Allowed iff previous * (W - offset) / W + current + 1 <= N, multiplied through by W.
local weighted = previous * (window - offset)
if current < limit then
  local headroom = (limit - current - 1) * window
  if weighted <= headroom then
    redis.call('HSET', key, 'w', string.format('%d', index), 'c', current + 1, 'p', previous)
    -- The state matters until the end of the next window: at most 2 W from now.
    redis.call('PEXPIRE', key, string.format('%d', 2 * window))
    return {1, math.floor((headroom - weighted) / window)}
  end
  -- Room in this window's count: wait until the previous window's weight has decayed enough.
  return {0, window - offset - math.floor(headroom / previous)}
end
-- This window's count is full: wait for the next window, where it becomes the previous count
-- and must decay until current * (W - o') <= (N - 1) * W.
return {0, window - offset + math.ceil(window * (current - limit + 1) / current)}
