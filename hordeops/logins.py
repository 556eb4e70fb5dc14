"""Failed admin logins, counted in Redis per client address, per user name from one address,
and per user name from anywhere; past their bounds the admin refuses logins until the window
that began with the first failure ends (ADMIN_LOGIN_* settings). The account page's sign-ins
with a key are counted the same way, the key's hash standing as the name (`front/account.py`).

A public horde's moderator accounts are one password away from its accounts and workers:
without a bound, a password can be tried without end. But a bound on a name alone lets anyone
lock its moderator out (five wrong passwords from anywhere, every window, and even the right
one is refused), so a name is locked only for the addresses that failed it:

- an address that failed ADMIN_LOGIN_FAILURES_PER_ADDRESS times, for any names, is refused;
- an address that failed one name ADMIN_LOGIN_FAILURES_PER_USER times is refused for it;
- a name that failed ADMIN_LOGIN_FAILURES_PER_USER_TOTAL times from anywhere is under attack:
  each address then has `UNDER_ATTACK_TRIES` tries at it, not ADMIN_LOGIN_FAILURES_PER_USER.

So the owner, from an address that has not failed, always gets in, and nobody can extend a
lockout of anyone else's address. An IPv6 address counts as its /64, as in the rate limits.
Each failure is logged at WARNING with the name tried and the address (never the password). A
successful login clears its name's count from its address; `manage.py unlock_logins` clears a
name's or an address's counts before the window ends.

Redis unreachable: logins are neither counted nor refused (the admin stays usable in a Redis
outage, when it is most needed), and that is logged.
"""

import hashlib
import logging
from dataclasses import dataclass

import redis.exceptions
from django.conf import settings
from django.http import HttpRequest
from django_redis import get_redis_connection

from hordeops.ratelimit import address_bucket, request_address

logger = logging.getLogger(__name__)

KEY_PREFIX = "hordeops:login-failures:"
# Tries each address has at a name under attack (whatever ADMIN_LOGIN_FAILURES_PER_USER says):
# one typo of its owner's is forgiven.
UNDER_ATTACK_TRIES = 2


@dataclass(frozen=True)
class Lockout:
    """Why logins are refused now, and for how many more seconds."""

    what: str  # "address" (any name from it) or "user" (this name from this address)
    seconds: int

    @property
    def reason(self) -> str:
        return "from this address" if self.what == "address" else "for this user from this address"

    @property
    def wait(self) -> str:
        """How long to wait, as a refusal says it: whole minutes, rounded up."""
        minutes = -(-self.seconds // 60)
        return f"try again in {minutes} minute{'s' if minutes != 1 else ''}"


def _name(username: str) -> str:
    # Hashed: a key holds no user input as such.
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()


def _keys(address: str, username: str) -> dict[str, str]:
    name = _name(username)
    return {
        "address": f"{KEY_PREFIX}address:{address}",
        "pair": f"{KEY_PREFIX}pair:{name}:{address}",
        "user": f"{KEY_PREFIX}user:{name}",
    }


def address_of(request: HttpRequest) -> str:
    return address_bucket(request_address(request))


def lockout(*, request: HttpRequest, username: str) -> Lockout | None:
    """The lockout a login attempt from this request for `username` meets, if any."""
    keys = _keys(address_of(request), username)
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for key in keys.values():
            pipe.get(key)
            pipe.ttl(key)
        answers = pipe.execute()
    except redis.exceptions.RedisError as error:
        logger.error("admin login limits not checked: %s", type(error).__name__)
        return None
    (address, address_ttl), (pair, pair_ttl), (total, _) = (
        (int(answers[i] or 0), answers[i + 1]) for i in range(0, 6, 2)
    )
    if address >= settings.ADMIN_LOGIN_FAILURES_PER_ADDRESS:
        return Lockout(what="address", seconds=max(1, address_ttl))
    tries = settings.ADMIN_LOGIN_FAILURES_PER_USER
    if total >= settings.ADMIN_LOGIN_FAILURES_PER_USER_TOTAL:
        tries = min(tries, UNDER_ATTACK_TRIES)
    if pair >= tries:
        return Lockout(what="user", seconds=max(1, pair_ttl))
    return None


def record_failure(*, request: HttpRequest | None, username: str, what: str = "admin login") -> None:
    """Count a failed login against its address, its name from there and its name (each window
    starts at its first failure). `what` names the sign-in in the log (the account page's)."""
    address = address_of(request) if request is not None else ""
    logger.warning("%s failed for user %r from %s", what, username, address or "?")
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for key in _keys(address, username).values():
            pipe.incr(key)
            pipe.expire(key, settings.ADMIN_LOGIN_WINDOW_SECONDS, nx=True)
        pipe.execute()
    except redis.exceptions.RedisError as error:
        logger.error("admin login failure not counted: %s", type(error).__name__)


def unlock(*, username: str | None = None, address: str | None = None) -> int:
    """Clear a name's counts (from every address), an address's (for every name), or, given
    both, that name's from that address; how many counts were cleared."""
    redis_client = get_redis_connection("default")
    name = _name(username) if username is not None else "*"
    where = address_bucket(address) if address is not None else "*"
    keys = list(redis_client.scan_iter(f"{KEY_PREFIX}pair:{name}:{where}"))
    if username is not None and address is None:
        keys.append(f"{KEY_PREFIX}user:{name}")
    if address is not None and username is None:
        keys.append(f"{KEY_PREFIX}address:{where}")
    return redis_client.delete(*keys) if keys else 0


def clear_user(*, username: str, request: HttpRequest) -> None:
    try:
        get_redis_connection("default").delete(_keys(address_of(request), username)["pair"])
    except redis.exceptions.RedisError as error:
        logger.error("admin login failures not cleared: %s", type(error).__name__)


def on_login_failed(sender, credentials: dict, request: HttpRequest | None = None, **kwargs) -> None:
    record_failure(request=request, username=str(credentials.get("username", "")))


def on_logged_in(sender, request: HttpRequest, user, **kwargs) -> None:
    clear_user(username=user.get_username(), request=request)
