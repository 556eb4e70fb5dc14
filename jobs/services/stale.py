"""The stale pass: abort generations whose lease lapsed, restart or fault their requests."""

import logging
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from django.db import connection, transaction

from hordeops import clock, metrics
from jobs.models import Generation, TextRequest, lease_end_sql
from jobs.services.endings import (
    STATES,
    _cancel_generations,
    _count_aborts,
    _count_stale_aborts,
    _end_streams,
    _relay_restarts,
    _restart_requests,
)

logger = logging.getLogger(__name__)


# pg_advisory_xact_lock key: one stale pass at a time across every Celery worker.
STALE_PASS_LOCK_KEY = 0x686F726465  # "horde"


@dataclass
class StalePassResult:
    ran: bool = True
    aborted: int = 0
    expired_requests: int = 0
    cancelled_by_expiry: int = 0
    maintenance: list[str] = field(default_factory=list)


def abort_stale_generations(*, now: datetime | None = None) -> StalePassResult:
    """Expire old requests, abort every generation past its lease and restart its request.

    Set-based: a fixed number of statements whatever the number of rows. A submit that
    reaches a generation before this pass does is accepted; one after it gets AbortedGen.
    """
    now = now or clock.now()
    result = StalePassResult()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [STALE_PASS_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return StalePassResult(ran=False)
        reason = (
            "CASE WHEN r.deadline_at IS NOT NULL AND r.deadline_at <= r.expires_at"
            " THEN 'generation_deadline_exceeded' ELSE 'request_expired' END"
        )
        with connection.cursor() as cursor:
            # Requests past their lifetime or deadline: cancel their running generations,
            # then expire them. Nothing restarts them.
            cursor.execute(
                f"""
                SELECT g.id, {reason} FROM {Generation._meta.db_table} AS g
                JOIN {TextRequest._meta.db_table} AS r ON g.request_id = r.id
                WHERE g.state = %(processing)s AND r.state = %(active)s AND r.expires_at <= %(now)s
                FOR UPDATE OF g
                """,
                {**STATES, "now": now},
            )
            ending = cursor.fetchall()
            for why in {why for _, why in ending}:
                _cancel_generations([g for g, w in ending if w == why], why, now)
            cancelled = [generation_id for generation_id, _ in ending]
            cursor.execute(
                f"""
                UPDATE {TextRequest._meta.db_table} AS r SET state = %(expired)s, queued = 0
                WHERE r.state = %(active)s AND r.expires_at <= %(now)s
                RETURNING r.id, r.kind, {reason}
                """,
                {**STATES, "now": now},
            )
            expired = cursor.fetchall()
            # The lapse test (`Generation.objects.stale(now)`, from `lease_end_sql`) must sit in this
            # UPDATE's own WHERE: a renewal committed while the pass waits on the row lock is
            # then re-checked against the renewed job_ttl. A subquery would not be re-checked.
            cursor.execute(
                f"""
                UPDATE {Generation._meta.db_table} SET state = %(aborted)s, finished_at = %(now)s
                WHERE state = %(processing)s
                  AND {lease_end_sql()} < %(now)s
                RETURNING id, request_id, worker_id, trusted_at_pop
                """,
                {**STATES, "now": now},
            )
            rows = cursor.fetchall()
        result.cancelled_by_expiry = len(cancelled)
        result.expired_requests = len(expired)
        expired_chats = [
            (request_id, why) for request_id, kind, why in expired if kind == TextRequest.Kind.CHAT
        ]
        result.aborted = len(rows)
        outcomes: list[tuple[UUID, str, bool]] = []
        if rows:
            outcomes = _restart_requests(Tally(row[1] for row in rows))
            result.maintenance = _count_aborts(Tally(row[2] for row in rows), now)
        by_trust = Tally(metrics.trust_label(row[3]) for row in rows)
        aborted = [(row[1], row[0]) for row in rows]

        def after_commit() -> None:
            _count_stale_aborts(by_trust, now)
            _end_streams(expired_chats, cancelled)
            _relay_restarts(outcomes, aborted)

        transaction.on_commit(after_commit)
    if result.aborted or result.expired_requests:
        logger.info(
            "stale pass: aborted %d generations, expired %d requests, %d workers into maintenance",
            result.aborted,
            result.expired_requests,
            len(result.maintenance),
        )
    return result
