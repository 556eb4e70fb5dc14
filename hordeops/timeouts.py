"""Address timeouts: client addresses and networks a moderator has put into timeout, refused
on every API route, the horde's and the `/v1` ones (403 TimeoutIP), but the heartbeat and the
moderators' own operations routes. The routes that queue a request are refused by their
admission (`jobs.admission`), after maintenance and suspension as the AI Horde orders them; the
others, by `hordeops.api.RateLimitMiddleware` before any work.

The record is `workers.models.AddressTimeout` (the admin, `/api/v2/operations/ipaddr`); what
the routes check is its copy in one Redis hash, network -> end (Unix seconds), rewritten whole
by `publish` at each change and by a beat pass every minute (so a Redis that lost it has it
again within that). Each process reads the hash at most once a SNAPSHOT_SECONDS: a route's
check is a look-up in memory, and with no timeout at all, one comparison. A timeout set in one
process is seen by the others within a second.
"""

import ipaddress
import logging
import math
import threading
import time

import redis.exceptions
from django.conf import settings
from django_redis import get_redis_connection

from hordeops import clock, errors, metrics

logger = logging.getLogger(__name__)

KEY = "hordeops:address-timeouts"
SNAPSHOT_SECONDS = 1.0
CHECKED_PATHS = ("/api/", "/v1/")
# What a timed-out address may still call: the operator's probe, and the moderators' own
# routes (a moderator behind a timed-out network can lift it).
EXEMPT_PATHS = ("/api/v2/status/heartbeat", "/api/v2/operations/")
# The routes that queue a request: their admission refuses a timed-out address, in its order.
ADMITTED_PATHS = frozenset(
    (
        "/api/v2/generate/text/async",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
    )
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_lock = threading.Lock()
# (read at, monotonic; the timeouts: network and end, Unix seconds)
_snapshot: tuple[float, tuple[tuple[Network, float], ...]] | None = None


# The IPv4 addresses mapped into IPv6 (::ffff:a.b.c.d): held as the IPv4 ones they are.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


# The shortest prefixes a moderator may time out: a wider one shuts out a good part of the
# Internet with the raid (`0.0.0.0/0` every IPv4 caller).
SHORTEST_PREFIX = {4: 8, 6: 32}
_LOOPBACK = (ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv6Network("::1/128"))


class RefusedNetwork(ValueError):
    """A network a moderator may not time out; the message says why."""


def network(text: str) -> Network:
    """An address or a CIDR network as the timeouts hold it; ValueError if it is neither.

    An IPv4 address is its /32; an IPv6 address, or a network narrower than /64, its /64, as
    the rate and worker limits count it (one subscriber has at least a /64: a single address's
    timeout would let the next one escape); an IPv4-mapped IPv6 one, the IPv4 one it maps.
    """
    text = text.strip()
    if not text or len(text) > 50:
        raise ValueError(text)
    net = ipaddress.ip_network(text, strict=False)
    if net.version == 6 and net.prefixlen >= 96 and net.subnet_of(_MAPPED):
        return ipaddress.IPv4Network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96))
    if net.version == 6 and net.prefixlen > 64:
        return net.supernet(new_prefix=64)
    return net


def network_to_time_out(text: str) -> Network:
    """`network(text)`, refused (RefusedNetwork) where a timeout would shut out everyone or the
    horde itself: a prefix shorter than SHORTEST_PREFIX, loopback, or any network overlapping
    TRUSTED_PROXIES (every call through them would be refused). The admin's form and
    `/api/v2/operations/ipaddr` both check with it."""
    net = network(text)
    shortest = SHORTEST_PREFIX[net.version]
    if net.prefixlen < shortest:
        raise RefusedNetwork(
            f"A timeout may cover at most a /{shortest} (IPv{net.version}): {shown(net)} is wider."
        )
    if any(net.version == other.version and net.overlaps(other) for other in _LOOPBACK):
        raise RefusedNetwork(
            f"{shown(net)} holds loopback, the horde's own host: it cannot be put into timeout."
        )
    for proxy in settings.TRUSTED_PROXIES:
        if net.version == proxy.version and net.overlaps(proxy):
            raise RefusedNetwork(
                f"{shown(net)} overlaps the horde's proxy {shown(proxy)} (TRUSTED_PROXIES): "
                "every call through it would be refused."
            )
    return net


def shown(net: Network) -> str:
    """A network as the timeouts name it: a single address bare, else its CIDR."""
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def publish(ends: dict[str, float]) -> None:
    """Replace the timeouts the routes check with `ends` (network -> end, Unix seconds)."""
    global _snapshot
    client = get_redis_connection("default")
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(KEY)
        if ends:
            pipe.hset(KEY, mapping={name: repr(end) for name, end in ends.items()})
        pipe.execute()
    with _lock:
        _snapshot = None


def _current() -> tuple[tuple[Network, float], ...]:
    global _snapshot
    snapshot = _snapshot
    read_at = time.monotonic()
    if snapshot is not None and read_at - snapshot[0] < SNAPSHOT_SECONDS:
        return snapshot[1]
    try:
        stored = get_redis_connection("default").hgetall(KEY)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        # Without Redis the routes that need it answer 503 themselves; the last timeouts known
        # still apply, checked again in a second.
        logger.warning("address timeouts not read: Redis is unavailable")
        entries = snapshot[1] if snapshot is not None else ()
    else:
        entries = tuple((network(name.decode()), float(end)) for name, end in stored.items())
    with _lock:
        _snapshot = (read_at, entries)
    return entries


def any_active() -> bool:
    """Whether any timeout is known (expired ones count until the next publish)."""
    return bool(_current())


def seconds_left(address: str, *, now: float | None = None) -> int:
    """How long `address` is still in timeout (the longest of the timeouts that hold it), in
    whole seconds, at `now` (Unix seconds; the horde's clock if None); 0 if it is not."""
    entries = _current()
    if not entries:
        return 0
    if now is None:
        now = clock.now().timestamp()
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        # The middleware refuses an address it cannot read before this (`ratelimit.readable`).
        return 0
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    left = max((end - now for net, end in entries if ip.version == net.version and ip in net), default=0)
    return max(0, math.ceil(left))


def refusal(address: str, *, now: float | None = None) -> errors.TimeoutIP | None:
    """The refusal of a call from `address` while it is in timeout (counted), else None."""
    if not address or not any_active():
        return None
    seconds = seconds_left(address, now=now)
    if not seconds:
        return None
    metrics.increment_soon(metrics.TIMED_OUT_REFUSALS, now=clock.now())
    return errors.TimeoutIP(seconds)


def is_checked_path(path: str) -> bool:
    """Whether the middleware checks `path`: an API route, neither exempt nor left to admission."""
    return path.startswith(CHECKED_PATHS) and not path.startswith(EXEMPT_PATHS) and path not in ADMITTED_PATHS


def forget() -> None:
    """Drop this process's snapshot (between tests)."""
    global _snapshot
    with _lock:
        _snapshot = None
