"""The stale pass: abort generations whose lease lapsed, restart or fault their requests."""

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction

from hordeops import clock, metrics
from jobs import sql
from jobs.models import Ending
from jobs.services.endings import (
    AbortedJob,
    Restart,
    cancel_deferred,
    cancel_unfollowed,
    expire_past,
    relay_restarts,
    restart_requests,
)
from workers.services import count_aborts

logger = logging.getLogger(__name__)


# pg_advisory_xact_lock key: one stale pass at a time across every Celery worker.
STALE_PASS_LOCK_KEY = 0x686F726465  # "horde"


@dataclass
class StalePassResult:
    ran: bool = True
    aborted: int = 0
    expired_requests: int = 0
    cancelled_by_expiry: int = 0
    deferred_cancellations: int = 0
    unfollowed: int = 0
    maintenance: list[str] = field(default_factory=list)


def abort_stale_generations(*, now: datetime | None = None) -> StalePassResult:
    """Expire old requests, abort every generation past its lease and restart its request.

    Set-based: a fixed number of statements whatever the number of rows. A submit that
    reaches a generation before this pass does is accepted; one after it gets AbortedGen.
    """
    now = now or clock.now()
    result = StalePassResult()
    # First the cancellations that waited for the database (it was down when their requesters
    # left), so that none of their jobs is restarted for nobody.
    result.deferred_cancellations = len(cancel_deferred(now=now))
    # And those whose requester's web process died: nobody waits for their output.
    result.unfollowed = len(cancel_unfollowed(now=now))
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql.STALE_PASS_LOCK, [STALE_PASS_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return StalePassResult(ran=False)
        with connection.cursor() as cursor:
            # Requests past their lifetime or deadline first: nothing restarts their jobs.
            expiry = expire_past(cursor, now=now)
            result.expired_requests, result.cancelled_by_expiry = (
                len(expiry.requests),
                len(expiry.generations),
            )
            # The lapse test, in the UPDATE's own WHERE (see sql.abort_lapsed).
            cursor.execute(sql.abort_lapsed(), {"now": now})
            rows = cursor.fetchall()
        result.aborted = len(rows)
        restarts: list[Restart] = []
        if rows:
            restarts = restart_requests(
                counts=Counter(row[1] for row in rows), after_commit=Ending.ABORTED, now=now
            )
            result.maintenance = count_aborts(counts=Counter(row[2] for row in rows), now=now)
        by_trust = Counter(metrics.trust_label(row[3]) for row in rows)
        aborted = [AbortedJob(request_id=row[1], generation_id=row[0]) for row in rows]

        def after_commit() -> None:
            for trust, count in by_trust.items():
                metrics.increment(metrics.STALE_ABORTS, trust, amount=count, now=now)
            relay_restarts(restarts=restarts, aborted=aborted)

        # robust: the pass has committed; Redis failing now must not make it look undone.
        transaction.on_commit(after_commit, robust=True)
    if result.aborted or result.expired_requests:
        logger.info(
            "stale pass: aborted %d generations, expired %d requests, %d workers into maintenance",
            result.aborted,
            result.expired_requests,
            len(result.maintenance),
        )
    return result
