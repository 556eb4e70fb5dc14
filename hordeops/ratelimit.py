"""Requester rate limits: a token bucket per API key and one per client address, in Redis.

One Lua script takes a token from each bucket the request belongs to, or from none: a
request refused by one bucket costs the other nothing. Each bucket refills at its rate per
second up to its burst. The client address is the connection's peer, or, when the peer is a
proxy named in TRUSTED_PROXIES, the nearest address in X-Forwarded-For that is not such a
proxy: a caller cannot choose its own address.
"""

import hashlib
import ipaddress
import logging
import time
from dataclasses import dataclass

import redis.exceptions
from django.conf import settings
from django_redis import get_redis_connection

from hordeops.keys import ANONYMOUS_API_KEY

logger = logging.getLogger(__name__)

# The routes of requesters (CONTRACT.md section 12); workers' pops, posts and submits are not
# limited here: their own rules bound them.
REQUESTER_PATHS = ("/api/v2/generate/text/async", "/api/v2/generate/text/status/", "/v1/")

# KEYS: the buckets. ARGV: now (ms), then rate per second and burst for each bucket.
# Returns 0 when a token was taken from every bucket, or else the milliseconds until every
# bucket has one (nothing taken).
TOKEN_BUCKET_SCRIPT = """
local now = tonumber(ARGV[1])
local levels, wait = {}, 0
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(state[1]) or burst, tonumber(state[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
  levels[i] = tokens
  if tokens < 1 then
    wait = math.max(wait, math.ceil((1 - tokens) * 1000 / rate))
  end
end
if wait > 0 then
  return wait
end
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', levels[i] - 1, 'at', now)
  redis.call('PEXPIRE', key, math.ceil(burst * 1000 / rate) + 1000)
end
return 0
"""

_script = None


@dataclass(frozen=True)
class Bucket:
    key: str
    rate: float
    burst: int


def is_requester_path(path: str) -> bool:
    return path.startswith(REQUESTER_PATHS)


def client_address(peer: str, forwarded_for: str) -> str:
    """The client's address: `peer`, or the nearest untrusted hop when `peer` is a trusted proxy."""
    trusted = settings.TRUSTED_PROXIES
    if not trusted or not _is_trusted(peer, trusted):
        return peer
    for hop in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
        if not _is_trusted(hop, trusted):
            return hop
    return peer  # every hop is one of ours: the request came from inside


def _is_trusted(address: str, trusted: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def buckets(*, api_key: str, address: str) -> list[Bucket]:
    """The buckets a request takes a token from. The anonymous key is everyone's, so only its
    callers' addresses are limited; a rate of 0 turns that limit off."""
    found = []
    if api_key and api_key != ANONYMOUS_API_KEY and settings.KEY_RATE_PER_SECOND > 0:
        # By the key itself, valid or not (guessing keys is limited as much as using one),
        # hashed: no key is written into Redis.
        digest = hashlib.sha256(api_key.encode()).hexdigest()[:32]
        rate, burst = settings.KEY_RATE_PER_SECOND, settings.KEY_RATE_BURST
        found.append(Bucket(f"hordeops:rate:key:{digest}", rate, burst))
    if address and settings.ADDRESS_RATE_PER_SECOND > 0:
        rate, burst = settings.ADDRESS_RATE_PER_SECOND, settings.ADDRESS_RATE_BURST
        found.append(Bucket(f"hordeops:rate:addr:{address}", rate, burst))
    return found


def take(found: list[Bucket], *, now: float | None = None) -> float:
    """Take a token from every bucket, or from none; return 0, or the seconds to wait."""
    if not found:
        return 0.0
    global _script
    if _script is None:
        _script = get_redis_connection("default").register_script(TOKEN_BUCKET_SCRIPT)
    args: list[float | int] = [int((time.time() if now is None else now) * 1000)]
    for bucket in found:
        args += [bucket.rate, bucket.burst]
    try:
        wait_ms = _script(keys=[bucket.key for bucket in found], args=args)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        # The route itself answers 503 when it needs Redis; a limit that cannot be read is
        # not a reason to refuse what the database alone could serve.
        logger.warning("rate limit not checked: Redis is unavailable")
        return 0.0
    return wait_ms / 1000
