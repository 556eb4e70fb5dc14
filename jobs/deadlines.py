"""Generation deadlines: `X-MultiLLM-Deadline-Ms` and its internal-hop twin
(docs/reference/generation_deadline.md).

The budget is one monotonic clock started when the request reaches the ASGI app, before its
body is read; every later phase (auth and parsing, admission, queue wait, restarts, the
worker's generation, stream preflight) spends it. No header, no change.
"""

import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import redis.exceptions
from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from hordeops import clock, dbwait, errors
from hordeops.parsing import ascii_int

HEADER = "X-MultiLLM-Deadline-Ms"
INTERNAL_HEADER = "X-MultiLLM-Internal-Deadline-Ms"
SIGNATURE_HEADER = "X-MultiLLM-Internal-Signature"
# How old (or how far ahead) a signature's timestamp may be, in seconds.
SIGNATURE_WINDOW_SECONDS = 30
_DIGITS = re.compile(r"[0-9]+")
# Longer digit strings are refused before int() (Python refuses over 4300 digits: a 500).
_MAX_DIGITS = 15
# A signature seen once is remembered for as long as its timestamp could still be accepted.
_SEEN_SIGNATURE_KEY = "hordeops:internal-hop:{}"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """A generation budget of `total_ms` on this host's monotonic clock, from `started`."""

    total_ms: int
    started: float

    def remaining_ms(self) -> int:
        """Milliseconds left, rounded down; 0 once spent."""
        spent = (time.monotonic() - self.started) * 1000
        return max(0, int(self.total_ms - spent))

    def remaining_seconds(self) -> float:
        return max(0.0, self.total_ms / 1000 - (time.monotonic() - self.started))

    @property
    def until(self) -> float:
        """When the budget runs out, on the monotonic clock."""
        return self.started + self.total_ms / 1000

    @property
    def expired(self) -> bool:
        return self.remaining_seconds() <= 0

    def check(self) -> None:
        if self.expired:
            raise errors.GenerationDeadlineExceeded()

    def deadline_at(self, now: datetime) -> datetime:
        """When the budget runs out on the wall clock, for the request row (its life ends
        then); raises GenerationDeadlineExceeded if it already has."""
        self.check()
        return now + timedelta(milliseconds=self.remaining_ms())

    def within(self, limit_ms: int | None) -> "Budget":
        """The same budget, cut to `limit_ms` (an account's limit, say) when that is shorter."""
        return replace(self, total_ms=min(self.total_ms, limit_ms)) if limit_ms else self


def _parse(value: str, maximum: int) -> int:
    if not _DIGITS.fullmatch(value):
        raise errors.InvalidGenerationDeadline()
    if len(value.lstrip("0")) > _MAX_DIGITS:
        ms = maximum + 1  # out of range, whatever its exact value
    else:
        ms = int(value)
    if not 1 <= ms <= maximum:
        raise errors.InvalidGenerationDeadline(
            f"X-MultiLLM-Deadline-Ms must be an integer from 1 to {maximum}."
        )
    return ms


def _route_limit(path: str) -> int | None:
    return settings.GENERATION_DEADLINE_ROUTE_LIMITS_MS.get(path.rstrip("/"))


def internal_signature(*, secret: str, method: str, path: str, value: str, timestamp: int) -> str:
    message = f"{method.upper()}\n{path}\n{value}\n{timestamp}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign_internal_deadline(
    *, secret: str, method: str, path: str, remaining_ms: int, now: float | None = None
) -> dict[str, str]:
    """Headers an internal caller adds to forward its remaining budget to hordeops.

    The value is the rounded-down remaining milliseconds; the signature is HMAC-SHA256 with
    the shared INTERNAL_HOP_SECRET over the method, path, that value and a fresh timestamp.
    """
    timestamp = int(time.time() if now is None else now)
    value = str(int(remaining_ms))
    signature = internal_signature(secret=secret, method=method, path=path, value=value, timestamp=timestamp)
    return {INTERNAL_HEADER: value, SIGNATURE_HEADER: f"t={timestamp},v1={signature}"}


def _authenticated_internal(request: HttpRequest, value: str) -> bool:
    secret = settings.INTERNAL_HOP_SECRET
    raw = request.headers.get(SIGNATURE_HEADER, "")
    if not secret or not raw:
        return False
    parts = dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
    timestamp = ascii_int(parts.get("t"), max_digits=_MAX_DIGITS)
    if timestamp is None or "v1" not in parts:
        return False
    if abs(time.time() - timestamp) > SIGNATURE_WINDOW_SECONDS:
        return False
    expected = internal_signature(
        secret=secret, method=request.method or "", path=request.path, value=value, timestamp=timestamp
    )
    # As bytes: compare_digest raises TypeError on a str with non-ASCII characters.
    if not hmac.compare_digest(expected.encode(), parts["v1"].encode()):
        return False
    return _first_use(parts["v1"])


def _first_use(signature: str) -> bool:
    """Whether this is the first time the signature is seen: a captured header is good once.

    Without Redis the hop cannot be told from a replay, so it is ignored, as an
    unauthenticated one is: the budget falls back to the public header.
    """
    try:
        return cache.add(_SEEN_SIGNATURE_KEY.format(signature), 1, timeout=2 * SIGNATURE_WINDOW_SECONDS + 1)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        logger.warning("internal deadline header ignored: Redis is unavailable")
        return False


def budget_for(request: HttpRequest) -> Budget | None:
    """The request's generation budget, or None when it sets no deadline.

    Raises InvalidGenerationDeadline for a malformed header. A shorter route limit wins (the
    account's is applied once the caller is known: `for_account`); an authenticated internal
    hop can only shorten the budget, and an unauthenticated or replayed one is ignored. A
    signed internal header costs one Redis command.
    """
    maximum = settings.GENERATION_DEADLINE_MAX_MS
    if maximum is None:  # a malformed maximum disables deadlines
        return None
    limits = []
    public = request.headers.get(HEADER)
    if public is not None:
        limits.append(_parse(public, maximum))
    internal = request.headers.get(INTERNAL_HEADER)
    if (
        internal is not None
        and _DIGITS.fullmatch(internal)
        and len(internal.lstrip("0")) <= _MAX_DIGITS
        and _authenticated_internal(request, internal)
    ):
        # Within the accepted range too: alone, a huge one would overflow the request's wall-clock deadline.
        limits.append(min(max(1, int(internal)), maximum))
    if not limits:
        return None
    route_limit = _route_limit(request.path)
    if route_limit:
        limits.append(route_limit)
    return Budget(total_ms=min(limits), started=clock.arrived(request))


def header_budget(request: HttpRequest) -> Budget | errors.DomainError | None:
    """The budget the headers set before the caller is known, or the error that refuses them,
    returned rather than raised: a bad key is a 401 whatever the header says, so the error
    waits for the key check. Cut to the account's limit with `Budget.within` once it is known.
    """
    try:
        return budget_for(request)
    except errors.DomainError as err:
        return err


def for_account(header: Budget | errors.DomainError | None, account) -> Budget | None:
    """The budget once the caller's key is checked: the header's error raised now, or the
    header's budget cut to the account's limit (a moderator's setting, when shorter)."""
    if isinstance(header, errors.DomainError):
        raise header
    return header.within(account.deadline_limit_ms) if header else None


def connection_wait(header: Budget | errors.DomainError | None):
    """A context in which database connection waits end with the budget (hordeops.dbwait)."""
    return dbwait.bounded(header.until if isinstance(header, Budget) else None)
