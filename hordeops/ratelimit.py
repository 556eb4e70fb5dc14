"""Rate limits: a token bucket per API key and one per client address, in Redis.

Every route but the worker routes (pop, progress, submit), the operator's heartbeat and
metrics, and static files takes a token: the requester routes, and every route that reads
the database without a key (discovery, users, workers, the schema, the admin). One Lua
script takes a token from each bucket the request belongs to, or from none: a request
refused by one bucket costs the other nothing. Each bucket refills at its rate per second up
to its burst.

The client address is the connection's peer, or, when the peer is a proxy named in
TRUSTED_PROXIES, the nearest address in X-Forwarded-For that is not such a proxy: a caller
cannot choose its own address, unless it is a service account's front end that proves it with
its proxy passkey (`request_address`). A port or brackets around it are taken off (`readable`); an
address that is still no IP address is refused (`is_unreadable`, 400 in the middleware). An
IPv6 address is bucketed by its /64, the least a network hands one subscriber, so that one
client cannot take a bucket per address of its own.

The worker routes are bounded by their own rules, but a call with a key no account has
takes a token from its address's bucket, and such keys are remembered in each process for
INVALID_KEY_CACHE_SECONDS (`KeyMemory`): the same bad key again is refused with no database
statement, and an address whose bucket is empty is refused before the database for as long
as it takes to refill, unless its key was seen to be good.
"""

import hashlib
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import redis.exceptions
from django.conf import settings
from django_redis import get_redis_connection

from hordeops.keys import ANONYMOUS_API_KEY

logger = logging.getLogger(__name__)

# Workers' pops, posts and submits: their own rules bound them (a bad key is limited apart).
WORKER_PATHS = ("/api/v2/generate/text/pop", "/api/v2/generate/text/progress", "/api/v2/generate/text/submit")
# Where a service account's front end may name its user's address (`request_address`).
PROXIED_PATHS = ("/api/", "/v1/")
# What operators and their tools call, and what a page loads with it: never limited.
UNLIMITED_PATHS = ("/api/v2/status/heartbeat", "/metrics", "/static/")

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


def is_unlimited_path(path: str) -> bool:
    return path.startswith(UNLIMITED_PATHS)


def is_worker_path(path: str) -> bool:
    return path.startswith(WORKER_PATHS)


def address_bucket(address: str) -> str:
    """What an address is counted as: itself, an IPv4 address mapped into IPv6 as the IPv4
    address, and any other IPv6 address as its /64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address


def client_address(peer: str, forwarded_for: str) -> str:
    """The client's address: `peer`, or the nearest untrusted hop when `peer` is a trusted proxy,
    a port or brackets a proxy wrote around it taken off (`readable`)."""
    trusted = settings.TRUSTED_PROXIES
    if not trusted or not _is_trusted(peer, trusted):
        return readable(peer)
    for hop in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
        hop = readable(hop)
        if not _is_trusted(hop, trusted):
            return hop
    return peer  # every hop is one of ours: the request came from inside


def readable(address: str) -> str:
    """`address` without the port or brackets some proxies add (`[2001:db8::1]:443`,
    `[2001:db8::1]`, `203.0.113.7:5678`), or as it was when it is not one of those forms:
    `is_unreadable` then tells the caller to refuse it rather than guess."""
    if address.startswith("["):
        inside, bracket, port = address[1:].partition("]")
        if bracket and (not port or (port[0] == ":" and port[1:].isdigit())):
            return inside if _is_ip(inside) and ":" in inside else address
        return address
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        if port.isdigit() and _is_ip(host):
            return host
    return address


def is_unreadable(address: str) -> bool:
    """Whether a client address is there but is no IP address: such a caller would escape its
    timeouts and have a rate bucket of its own, so the routes refuse it (400)."""
    return bool(address) and not _is_ip(address)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def request_address(request) -> str:
    """The client address of a Django request: `client_address` of its peer and X-Forwarded-For,
    or on the API routes a service account's `Proxied-For` (or `Proxy-For`) when its
    `Proxy-Authorization` is a known proxy passkey (`workers.proxies`): the address of the user
    it sends the request for. Never on the pages (the admin's login, the sign-up), whose limits
    per address no front end has a reason to spread."""
    meta = request.META
    proxied = meta.get("HTTP_PROXIED_FOR") or meta.get("HTTP_PROXY_FOR")
    if (
        proxied
        and request.path.startswith(PROXIED_PATHS)
        and _is_proxy_passkey(meta.get("HTTP_PROXY_AUTHORIZATION", "").strip())
    ):
        return readable(proxied.strip())
    return client_address(meta.get("REMOTE_ADDR", ""), meta.get("HTTP_X_FORWARDED_FOR", ""))


def _no_proxy_passkeys(passkey: str) -> bool:
    return False


_is_proxy_passkey = _no_proxy_passkeys


def register_proxy_passkeys(is_known: Callable[[str], bool]) -> None:
    """Set what tells a service account's proxy passkey (`workers` registers it when ready: the
    base imports no app)."""
    global _is_proxy_passkey
    _is_proxy_passkey = is_known


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
        found.append(Bucket(f"hordeops:rate:addr:{address_bucket(address)}", rate, burst))
    return found


def address_buckets(address: str) -> list[Bucket]:
    """The address's bucket alone (a worker route's call with a bad key)."""
    return buckets(api_key="", address=address)


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


class KeyMemory:
    """What one process remembers of the keys on worker routes, so that a flood of bad keys
    costs no database statement: keys no account had (for INVALID_KEY_CACHE_SECONDS), keys
    seen to be good (which pass an address's block), and addresses whose bucket a bad key
    emptied, until it has refilled. Each map holds at most `SIZE` entries, the oldest dropped."""

    SIZE = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bad: OrderedDict[str, float] = OrderedDict()
        self._good: OrderedDict[str, None] = OrderedDict()
        self._blocked: OrderedDict[str, float] = OrderedDict()
        self._blocked_until = 0.0  # when the last block ends

    def clear(self) -> None:
        with self._lock:
            self._bad.clear()
            self._good.clear()
            self._blocked.clear()
            self._blocked_until = 0.0

    def is_bad(self, api_key: str, now: float) -> bool:
        until = self._bad.get(api_key)
        return until is not None and until > now

    def blocking(self, now: float) -> bool:
        """Whether any address may be refused now."""
        return now < self._blocked_until

    def is_blocked(self, address: str, api_key: str, now: float) -> bool:
        until = self._blocked.get(address)
        if until is not None and until <= now:
            with self._lock:
                self._blocked.pop(address, None)
            return False
        return until is not None and api_key not in self._good

    def good(self, api_key: str) -> None:
        if api_key not in self._good:
            with self._lock:
                self._remember(self._good, api_key, None)

    def bad(self, api_key: str, now: float) -> None:
        if api_key and api_key != ANONYMOUS_API_KEY:
            with self._lock:
                self._good.pop(api_key, None)
                self._remember(self._bad, api_key, now + settings.INVALID_KEY_CACHE_SECONDS)

    def block(self, address: str, until: float) -> None:
        with self._lock:
            self._remember(self._blocked, address, until)
            self._blocked_until = max(self._blocked_until, until)

    def _remember(self, entries: OrderedDict, key: str, value) -> None:
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.SIZE:
            entries.popitem(last=False)


key_memory = KeyMemory()
