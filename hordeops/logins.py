"""Failed admin logins, counted per client address and per user name in Redis; past their
bound, the admin refuses further logins from that address, or for that name, until the
window that began with the first failure ends (ADMIN_LOGIN_* settings).

A public horde's moderator accounts are one password away from its accounts and workers:
without a bound, a password can be tried without end. Each failure is logged at WARNING with
the name tried and the address (never the password). A successful login clears its name's
count; `manage.py unlock_logins` clears a name's or an address's before the window ends.

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

from hordeops.ratelimit import client_address

logger = logging.getLogger(__name__)

KEY_PREFIX = "hordeops:login-failures:"


@dataclass(frozen=True)
class Lockout:
    """Why logins are refused now, and for how many more seconds."""

    what: str  # "address" or "user"
    seconds: int


def _keys(address: str, username: str) -> dict[str, str]:
    # The name hashed: a key holds no user input as such.
    name = hashlib.sha256(username.strip().lower().encode()).hexdigest()
    return {"address": f"{KEY_PREFIX}address:{address}", "user": f"{KEY_PREFIX}user:{name}"}


def _limits() -> dict[str, int]:
    return {
        "address": settings.ADMIN_LOGIN_FAILURES_PER_ADDRESS,
        "user": settings.ADMIN_LOGIN_FAILURES_PER_USER,
    }


def address_of(request: HttpRequest) -> str:
    return client_address(request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR", ""))


def lockout(*, request: HttpRequest, username: str) -> Lockout | None:
    """The lockout a login attempt from this request for `username` meets, if any."""
    keys, limits = _keys(address_of(request), username), _limits()
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for key in keys.values():
            pipe.get(key)
            pipe.ttl(key)
        answers = pipe.execute()
    except redis.exceptions.RedisError as error:
        logger.error("admin login limits not checked: %s", type(error).__name__)
        return None
    for index, what in enumerate(keys):
        count, ttl = answers[2 * index], answers[2 * index + 1]
        if count is not None and int(count) >= limits[what]:
            return Lockout(what=what, seconds=max(1, ttl))
    return None


def record_failure(*, request: HttpRequest | None, username: str) -> None:
    """Count a failed login against its address and its name (the window starts at the first)."""
    address = address_of(request) if request is not None else ""
    logger.warning("admin login failed for user %r from %s", username, address or "?")
    try:
        pipe = get_redis_connection("default").pipeline(transaction=False)
        for key in _keys(address, username).values():
            pipe.incr(key)
            pipe.expire(key, settings.ADMIN_LOGIN_WINDOW_SECONDS, nx=True)
        pipe.execute()
    except redis.exceptions.RedisError as error:
        logger.error("admin login failure not counted: %s", type(error).__name__)


def unlock(*, username: str | None = None, address: str | None = None) -> int:
    """Clear a name's and/or an address's failures; how many counts were cleared."""
    keys = []
    if username is not None:
        keys.append(_keys("", username)["user"])
    if address is not None:
        keys.append(_keys(address, "")["address"])
    return get_redis_connection("default").delete(*keys) if keys else 0


def clear_user(*, username: str) -> None:
    try:
        unlock(username=username)
    except redis.exceptions.RedisError as error:
        logger.error("admin login failures not cleared: %s", type(error).__name__)


def on_login_failed(sender, credentials: dict, request: HttpRequest | None = None, **kwargs) -> None:
    record_failure(request=request, username=str(credentials.get("username", "")))


def on_logged_in(sender, request: HttpRequest, user, **kwargs) -> None:
    clear_user(username=user.get_username())
