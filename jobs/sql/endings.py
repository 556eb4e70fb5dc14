"""Cancellation, restarts and the stale pass."""

from functools import cache

from jobs.models import Ending, Generation, TextRequest, lease_end_sql
from jobs.sql.names import (
    ABORTED,
    ACTIVE,
    CANCELLED,
    EXPIRED,
    FAULTED,
    GENERATIONS,
    PROCESSING,
    REQUESTS,
)
from kudos.sql import release_holds

# -- Endings: cancellation and restarts --------------------------------------------------------

# Whether a requester follows the request's relay stream (`TextRequest.relayed`).
RELAYED = f"(r.kind = '{TextRequest.Kind.CHAT.value}' OR r.followed)"


@cache
def cancel_generations() -> str:
    """Cancel processing generations (`ids`), each with its settlement information; the ids of
    those cancelled."""
    return f"""
        UPDATE {GENERATIONS} AS g
        SET state = '{CANCELLED}', finished_at = %(now)s, settlement_information = v.settlement
        FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(settlement)s::jsonb[]) AS settlement) AS v
        WHERE g.id = v.id AND g.state = '{PROCESSING}'
        RETURNING g.id
        """


@cache
def restart_requests() -> str:
    """Give `added` aborted jobs back to each request (`ids`), or fault it: past `max`
    restarts, or at once, ending `after_commit`, if one of the jobs' output had been committed
    to its stream (the generations' states are set before this runs); a faulted
    request's hold is released. Returns (id, state, relayed, ending) and, for waiting pops,
    what taking a job back in the queue needs (`jobs.waits.Offer`), then its `n`."""
    # A committed generation (`Generation.streamed`) among those just ended: its choice was
    # seen by its requester and cannot be served again. The others' choices can.
    committed = (
        f"EXISTS (SELECT FROM {GENERATIONS} AS g WHERE g.request_id = r.id AND g.streamed"
        f" AND g.state IN ('{ABORTED}', '{Generation.State.FAULTED.value}'))"
    )
    fault = f"r.state = '{ACTIVE}' AND ({committed} OR r.restarts + v.added >= %(max)s)"
    return f"""
        WITH restarted AS (
            UPDATE {REQUESTS} AS r SET
              restarts = r.restarts + v.added,
              queued = CASE WHEN r.state = '{ACTIVE}' AND NOT ({fault}) THEN r.queued + v.added ELSE 0 END,
              state = CASE WHEN {fault} THEN '{FAULTED}' ELSE r.state END,
              ending = CASE WHEN NOT ({fault}) THEN r.ending
                            WHEN {committed} THEN %(after_commit)s
                            ELSE '{Ending.RESTARTS.value}' END
            FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(added)s::int[]) AS added) AS v
            WHERE r.id = v.id
            RETURNING r.id, r.state, {RELAYED} AS relayed, r.ending, r.requested_models, r.kind,
                      r.max_length, r.max_context_length, r.queued, r.n
        ),
        {release_holds(rows=f"SELECT id AS request_id FROM restarted WHERE state = '{FAULTED}'")}
        SELECT id, state, relayed, ending, requested_models, kind, max_length, max_context_length, queued, n
        FROM restarted
        """


# -- The stale pass ----------------------------------------------------------------------------

# One stale pass at a time across every Celery worker (a transaction-scoped advisory lock).
STALE_PASS_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"

# Why a request past its `expires_at` ended: its deadline, or its lifetime.
_EXPIRY_REASON = (
    "CASE WHEN r.deadline_at IS NOT NULL AND r.deadline_at <= r.expires_at"
    f" THEN '{Ending.DEADLINE.value}' ELSE '{Ending.LIFETIME.value}' END"
)


# `one`: the statement for one request (`request_id`), as the status and a cancellation make
# it final the moment it passes its lifetime or deadline; else for every request (the pass).
def _which(one: bool) -> str:
    return " AND r.id = %(request_id)s" if one else ""


@cache
def ending_generations(one: bool = False) -> str:
    """Running generations of requests past their lifetime or deadline, locked, with why and
    the request's max_length."""
    return f"""
        SELECT g.id, {_EXPIRY_REASON}, r.max_length FROM {GENERATIONS} AS g
        JOIN {REQUESTS} AS r ON g.request_id = r.id
        WHERE g.state = '{PROCESSING}' AND r.state = '{ACTIVE}' AND r.expires_at <= %(now)s{_which(one)}
        FOR UPDATE OF g
        """


@cache
def expire_requests(one: bool = False) -> str:
    """Expire the requests past their lifetime or deadline, releasing their holds; returns
    (id, relayed, why)."""
    return f"""
        WITH expired AS (
            UPDATE {REQUESTS} AS r SET state = '{EXPIRED}', queued = 0, ending = {_EXPIRY_REASON}
            WHERE r.state = '{ACTIVE}' AND r.expires_at <= %(now)s{_which(one)}
            RETURNING r.id, {RELAYED} AS relayed, {_EXPIRY_REASON} AS why
        ),
        {release_holds(rows="SELECT id AS request_id FROM expired")}
        SELECT id, relayed, why FROM expired
        """


@cache
def abort_lapsed() -> str:
    """Abort every processing generation whose lease ended before `now`.

    The lapse test must sit in this UPDATE's own WHERE: a renewal committed while the pass
    waits on the row lock is then re-checked against the renewed job_ttl. A subquery would
    not be re-checked. Returns (id, request id, worker id, trusted at pop).
    """
    return f"""
        UPDATE {GENERATIONS} SET state = '{ABORTED}', finished_at = %(now)s
        WHERE state = '{PROCESSING}'
          AND {lease_end_sql()} < %(now)s
        RETURNING id, request_id, worker_id, trusted_at_pop
        """
