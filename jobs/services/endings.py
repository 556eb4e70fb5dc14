"""How requests and generations end: cancellation, restarts after an abort or a give-back,
abort counting, and the relay events that tell waiting requesters."""

import json
import logging
import math
from collections import Counter as Tally
from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from hordeops import clock, errors, metrics
from jobs import leases, relay
from jobs.models import Generation, TextRequest
from workers.models import Worker

logger = logging.getLogger(__name__)


STATES = {
    "active": TextRequest.State.ACTIVE,
    "expired": TextRequest.State.EXPIRED,
    "faulted": TextRequest.State.FAULTED,
    "processing": Generation.State.PROCESSING,
    "aborted": Generation.State.ABORTED,
    "cancelled": Generation.State.CANCELLED,
}


MAINTENANCE_REASON = (
    "Maintenance mode activated because worker is dropping too many jobs. "
    "Please investigate its speed and stability before leaving maintenance."
)


def cancel_request(
    *, request_id: UUID, reason: str = "cancelled", now: datetime | None = None
) -> TextRequest:
    """Drop the request's queued work and cancel its running generations.

    `reason` is what a waiting requester and the settlement record are told: "cancelled"
    (by the requester) or "generation_deadline_exceeded". Nothing restarts a cancelled job.
    """
    now = now or clock.now()
    with transaction.atomic():
        request = TextRequest.objects.select_for_update().filter(pk=request_id).first()
        if request is None:
            raise errors.RequestNotFound()
        if request.state == TextRequest.State.ACTIVE:
            request.state = TextRequest.State.CANCELLED
            request.queued = 0
            request.save(update_fields=["state", "queued"])
            running = list(request.generations.processing().values_list("pk", flat=True))
            _cancel_generations(running, reason, now)
            failures = [(request.pk, reason)] if request.kind == TextRequest.Kind.CHAT else []
            transaction.on_commit(lambda: _end_streams(failures, running))
    return request


def _cancel_generations(generation_ids: list[UUID], reason: str, now: datetime) -> None:
    """Cancel generations in workers' hands, keeping their settlement information.

    Usage is unknown (the worker never confirmed a final count); the tokens relayed are the
    worker's last reported count, or the relayed characters / 4. No text is kept.
    """
    if not generation_ids:
        return
    settlement = []
    for lease in leases.states(generation_ids):
        relayed = (
            int(lease["tokens"]) if lease.get("tokens") else math.ceil(int(lease.get("output_len", 0)) / 4)
        )
        settlement.append(
            json.dumps({"usage": "unknown", "tokens_relayed": relayed, "reservation": None, "reason": reason})
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Generation._meta.db_table} AS g
            SET state = %(cancelled)s, finished_at = %(now)s, settlement_information = v.settlement
            FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(settlement)s::jsonb[]) AS settlement) AS v
            WHERE g.id = v.id AND g.state = %(processing)s
            """,
            {**STATES, "ids": generation_ids, "settlement": settlement, "now": now},
        )


def _end_streams(failures: list[tuple[UUID, str]], dead_generations: list[UUID]) -> None:
    """Tell waiting requesters their requests ended, and kill the generations' leases."""
    leases.kill(dead_generations)
    relay.publish_many([(request_id, relay.FAILED, "", {"code": code}) for request_id, code in failures])


def _restart_requests(counts: Tally) -> list[tuple[UUID, str, bool, str]]:
    """Give aborted jobs back to their requests, or fault a request past its restarts.

    A request whose stream was committed to a requester faults at once: there is no
    fallback after commit. Returns (request id, state now, committed, kind) for each request.
    """
    ids, added = zip(*counts.items(), strict=True)
    fault = "r.state = %(active)s AND (r.stream_generation IS NOT NULL OR r.restarts + v.added >= %(max)s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {TextRequest._meta.db_table} AS r SET
              restarts = r.restarts + v.added,
              queued = CASE WHEN r.state = %(active)s AND NOT ({fault}) THEN r.queued + v.added ELSE 0 END,
              state = CASE WHEN {fault} THEN %(faulted)s ELSE r.state END
            FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(added)s::int[]) AS added) AS v
            WHERE r.id = v.id
            RETURNING r.id, r.state, r.stream_generation IS NOT NULL, r.kind
            """,
            {**STATES, "ids": list(ids), "added": list(added), "max": settings.TEXT_REQUEST_MAX_RESTARTS},
        )
        return cursor.fetchall()


def _relay_restarts(outcomes: list[tuple[UUID, str, bool, str]], aborted: list[tuple[UUID, UUID]]) -> None:
    """Kill the aborted generations' leases and tell each waiting chat requester what happened."""
    leases.kill([generation_id for _, generation_id in aborted])
    chats = {
        request_id: (state, committed)
        for request_id, state, committed, kind in outcomes
        if kind == TextRequest.Kind.CHAT
    }
    events = []
    for request_id, generation_id in aborted:
        if request_id not in chats:
            continue
        state, committed = chats[request_id]
        events.append((request_id, relay.RESTARTED, str(generation_id), {}))
        if state == TextRequest.State.FAULTED:
            code = "generation_aborted" if committed else "too_many_restarts"
            events.append((request_id, relay.FAILED, str(generation_id), {"code": code}))
    relay.publish_many(events)


def _count_aborts(counts: Tally, now: datetime) -> list[str]:
    """Count aborts in each worker's one-hour window; over the threshold means maintenance.

    Every value is computed from the worker row itself (no self-join), so two passes or a
    faulted submit racing the pass both count.
    """
    ids, added = zip(*counts.items(), strict=False)
    # The window's one reading (`Worker.ABORT_WINDOW`, as `Worker.aborts_in_window` reads it).
    expired = "(w.aborts_window_start IS NULL OR w.aborts_window_start < %(window_start)s)"
    new = f"(CASE WHEN {expired} THEN v.added ELSE w.aborted_jobs + v.added END)"
    over = f"({new} > %(threshold)s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Worker._meta.db_table} AS w SET
              aborted_jobs = CASE WHEN {over} THEN 0 ELSE {new} END,
              aborts_window_start = CASE WHEN {expired} THEN %(now)s ELSE w.aborts_window_start END,
              uncompleted_jobs = w.uncompleted_jobs + v.added,
              maintenance = w.maintenance OR {over},
              maintenance_reason = CASE WHEN NOT w.maintenance AND {over}
                                        THEN %(reason)s ELSE w.maintenance_reason END
            FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(added)s::int[]) AS added) AS v
            WHERE w.id = v.id
            RETURNING w.name, w.maintenance
            """,
            {
                "ids": list(ids),
                "added": list(added),
                "now": now,
                "window_start": now - Worker.ABORT_WINDOW,
                "threshold": settings.WORKER_ABORT_MAINTENANCE_THRESHOLD,
                "reason": MAINTENANCE_REASON,
            },
        )
        return [name for name, in_maintenance in cursor.fetchall() if in_maintenance]


def _count_stale_aborts(by_trust: Tally, now: datetime) -> None:
    for trust, count in by_trust.items():
        metrics.increment(metrics.STALE_ABORTS, trust, amount=count, now=now)
