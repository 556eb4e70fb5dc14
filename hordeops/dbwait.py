"""How long a request may wait for a pooled database connection.

Every wait is bounded by DATABASE_POOL_WAIT_SECONDS, so that an outage or an exhausted pool
answers 503 within a second or two rather than after the pool's own timeout; a request with
a generation deadline is bounded by what is left of it too (a generation deadline covers every
phase, waiting for a connection included), and a wait cut short by the deadline is its 504.
The bound is a context variable, so that it follows the request onto the thread that runs its
database work (`hordeops.asyncdb`, asgiref).
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings

# The monotonic time by which the current request must have its answer, when it has one.
_until: ContextVar[float | None] = ContextVar("hordeops_db_wait_until", default=None)


@dataclass(frozen=True)
class Wait:
    seconds: float
    by_deadline: bool  # the deadline, not the setting, is what bounds it


def current() -> Wait:
    """The longest the next connection wait may take, from now."""
    limit = settings.DATABASE_POOL_WAIT_SECONDS
    until = _until.get()
    if until is not None:
        left = until - time.monotonic()
        if left < limit:
            return Wait(max(0.0, left), by_deadline=True)
    return Wait(limit, by_deadline=False)


@contextmanager
def bounded(until: float | None) -> Iterator[None]:
    """Waits inside are bounded by `until` (monotonic) as well; None bounds them by the setting
    alone, as work that must be done whatever the deadline (a cancellation) is."""
    token = _until.set(until)
    try:
        yield
    finally:
        _until.reset(token)
