"""What a worker can do and when it counts as online (docs/reference/worker_protocol.md).

- A worker's capacity is `speed x (TEXT_JOB_LEASE_SECONDS - TEXT_JOB_PREPARATION_SECONDS)`
  tokens, its speed taken as UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND until measured; within
  its own lease cap it can produce `speed x (cap - preparation)`.
- A worker that popped within WORKER_ONLINE_SECONDS is online, unless it said goodbye since
  (`left_at`, set by a stopping bridge, cleared by its next pop).

These are the worker's half of the speed gate; the gate itself, which also reads the
request, is `jobs.eligibility`.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import ExpressionWrapper, F, FloatField, Value
from django.db.models.functions import Coalesce

# The online test in SQL, for a worker row `{w}` (the parameter is `online_since(now)`).
ONLINE_SQL = "{w}.last_pop_at >= %(online_since)s AND {w}.left_at IS NULL"


def generating_seconds(lease_seconds: int) -> int:
    """Seconds of a lease left for generating, after the preparation allowance."""
    return max(0, lease_seconds - settings.TEXT_JOB_PREPARATION_SECONDS)


def lease_window_seconds() -> int:
    return generating_seconds(settings.TEXT_JOB_LEASE_SECONDS)


# The largest capacity kept (a generation's `capacity_at_pop` is a PostgreSQL integer): far
# beyond any max_length, so the speed gate reads it as it would the real figure.
CAPACITY_CEILING = 2**31 - 1


def capacity(speed: float | None) -> int:
    """A worker's chat capacity in tokens: what it can produce inside the base lease."""
    effective = settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND if speed is None else speed
    return min(int(effective * lease_window_seconds()), CAPACITY_CEILING)


def capacity_expression(speed: str = "speed") -> ExpressionWrapper:
    """`capacity` in the ORM, for a worker's `speed` field, before the rounding down to whole
    tokens (below an integer max_length exactly when the whole tokens are)."""
    effective = Coalesce(F(speed), Value(float(settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND)))
    return ExpressionWrapper(effective * lease_window_seconds(), output_field=FloatField())


def online_since(now: datetime) -> datetime:
    """A worker that popped at or after this is online (the rule `ONLINE_SQL` applies in SQL)."""
    return now - timedelta(seconds=settings.WORKER_ONLINE_SECONDS)


def check_in_fresh_since(now: datetime) -> datetime:
    """A worker whose last pop is recorded at or after this is not written again by a pop
    that declares nothing new: the record lags a worker's last pop by at most a tenth of
    the online window (30 s of 300 by default, the AI Horde's check-in debounce)."""
    return now - timedelta(seconds=settings.WORKER_ONLINE_SECONDS / 10)
