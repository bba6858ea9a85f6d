"""The Lua scripts of the Redis coordinator. Each touches one bucket (its keys share a hash tag, so one slot on
Redis Cluster; the channel is passed as a key too, as sharded pub/sub wants) or the replicas set alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BASELINE", "CLAIM", "DECLARE", "GENERATION", "HEARTBEAT", "JOIN", "LEAVE", "PUBLISH_CHANGE", "Scripts"]

GENERATION = """
-- A stored generation as a number, or nil when this version cannot read it (not decimal digits alone below 2^53).
local function generation(text)
  if type(text) ~= 'string' or not string.match(text, '^%d+$') then return nil end
  local g = tonumber(text)
  if g >= 2^53 then return nil end
  return g
end
"""

HEARTBEAT = """
-- KEYS[1] replicas; ARGV[1] instance, ARGV[2] life in ms. Returns {live instances, dead instances, 1 when this
-- instance was not listed (its first beat, or it was taken for dead and cleaned up)}. Live: beat within its
-- life; dead: silent for twice that (a replica only late is not cleaned up).
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local life = tonumber(ARGV[2])
local added = redis.call('ZADD', KEYS[1], ms + life, ARGV[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], ms, '+inf')
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (ms - life), 'LIMIT', 0, 16)
return {live, dead, added}
"""

CLAIM = """
-- KEYS[1] replicas; ARGV[1] instance, ARGV[2] life in ms. Claims a dead instance's clean-up, only while it is still
-- dead: its deadline is set just behind now, so it is neither live nor listed dead for one life (one replica
-- cleans it up), and listed dead again after that unless the clean-up ends by removing it (a cleaner that stopped
-- half-way leaves it for the next). Returns true, or false when it is live again or listed no more.
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if not deadline or tonumber(deadline) >= ms - tonumber(ARGV[2]) then return false end
redis.call('ZADD', KEYS[1], 'XX', ms - 1, ARGV[1])
return true
"""

JOIN = """
-- KEYS[1] interest set, KEYS[2] state, KEYS[3] channel; ARGV[1] instance, ARGV[2] publish command, ARGV[3]
-- interest message. Returns {members, state fingerprint or false, state generation as stored or false}: the
-- caller reads the generation (one it cannot read must not cut the reply short, as a nil would).
redis.call('SADD', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[3], ARGV[3])
local state = redis.call('HMGET', KEYS[2], 'f', 'g')
return {redis.call('SMEMBERS', KEYS[1]), state[1], state[2]}
"""

LEAVE = """
-- KEYS[1] interest set, KEYS[2] channel; ARGV[1] instance, ARGV[2] publish command, ARGV[3] interest message.
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then redis.call(ARGV[2], KEYS[2], ARGV[3]) end
return 1
"""

PUBLISH_CHANGE = (
    GENERATION
    + """
-- KEYS[1] state, KEYS[2] channel; ARGV[1] fingerprint, ARGV[2] the generation the publisher last knew,
-- ARGV[3] state life in ms, ARGV[4] publish command, ARGV[5] message.
-- Returns {1, new generation, f} published; {0, g, f} already told (fenced: another replica told it);
-- {-1, g, f} the publisher's view is stale (someone told a change it has not heard of: it re-reads).
-- A state whose generation cannot be read is none: the change is recorded over it.
local f = redis.call('HGET', KEYS[1], 'f')
local g = generation(redis.call('HGET', KEYS[1], 'g') or '0')
if not g then f, g = false, 0 end
if f == ARGV[1] then return {0, g, f} end
if g ~= tonumber(ARGV[2]) then return {-1, g, f or false} end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'g', g + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call(ARGV[4], KEYS[2], ARGV[5])
return {1, g + 1, ARGV[1]}
"""
)

BASELINE = (
    GENERATION
    + """
-- KEYS[1] state, KEYS[2] channel; ARGV[1] fingerprint, ARGV[2] state life in ms, ARGV[3] publish command,
-- ARGV[4] message. A first look is the key's state only when the cluster has none yet (or none it can read).
if redis.call('HSETNX', KEYS[1], 'f', ARGV[1]) == 1 or not generation(redis.call('HGET', KEYS[1], 'g') or '0') then
  redis.call('HSET', KEYS[1], 'f', ARGV[1], 'g', 0)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call(ARGV[3], KEYS[2], ARGV[4])
return 1
"""
)


DECLARE = """
-- KEYS[1] readers; ARGV[1] instance, ARGV[2] its declaration ('' withdraws it), ARGV[3] the declaration it must hold
-- now ('' whatever it holds), ARGV[4] channel, ARGV[5] message. Written and told on the channel: returns 1; the field
-- held another declaration, or there was none to withdraw: 0, nothing told.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '' and current ~= ARGV[3] then return 0 end
if ARGV[2] == '' then
  if not current then return 0 end
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""


@dataclass(frozen=True, slots=True)
class Scripts:
    """The scripts registered on one client (each runs by its SHA, loaded on first use)."""

    heartbeat: Any
    claim: Any
    join: Any
    leave: Any
    publish_change: Any
    baseline: Any
    declare: Any

    @classmethod
    def register(cls, client: Any) -> Scripts:
        scripts = (HEARTBEAT, CLAIM, JOIN, LEAVE, PUBLISH_CHANGE, BASELINE, DECLARE)
        return cls(*(client.register_script(script) for script in scripts))
