"""The pop: check the worker in, then claim the first request it may be offered, in one statement."""

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection

from hordeops import clock, errors, metrics
from hordeops.rows import fetch_instance
from jobs import eligibility, leases, sql
from jobs.models import Generation, TextRequest
from workers.checkin import check_in_worker
from workers.declaration import WorkerDeclaration
from workers.models import Worker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoppedJob:
    request: TextRequest
    generations: list[Generation]

    @property
    def first(self) -> Generation:
        return self.generations[0]


@dataclass(frozen=True)
class EmptyPop:
    """A pop that found nothing, and why the head of the queue passed the worker over: the
    AI Horde's `skipped`, `{reason: count}` (`sql.skipped`)."""

    skipped: dict[str, int]
    worker_id: UUID | None = None  # whose pop it was: its messages go with the answer
    may_wait: bool = True  # False: offered nothing whatever is queued (paused, flagged)


class RecentSkips:
    """The `skipped` counts of a worker's last empty pops, per web process, reused for
    POP_SKIPPED_CACHE_SECONDS while the worker declares the same: an idle worker polls every
    second or two, and the counts are what its log shows, not what it is offered. Without
    them an empty pop is two statements instead of three (the count was a third of an empty
    pop's database time at 100,000 queued). Keyed by the worker and every value the count
    reads but the time, so that a worker that declares otherwise is counted afresh."""

    SIZE = 10_000  # workers remembered, the least recently counted forgotten first

    def __init__(self) -> None:
        self._counts: OrderedDict[tuple, tuple[datetime, dict[str, int]]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(params: dict[str, Any]) -> tuple:
        # The values alone, in the names' order (the same names at every pop): small enough
        # that SIZE of them stay a few MB.
        return tuple(
            tuple(value) if isinstance(value, list) else value
            for name, value in sorted(params.items())
            if name not in _TIMES
        )

    def get(self, key: tuple, now: datetime, seconds: int) -> dict[str, int] | None:
        with self._lock:
            counted_at, counts = self._counts.get(key, (None, None))
        if counted_at is None or not 0 <= (now - counted_at).total_seconds() < seconds:
            return None
        return counts

    def put(self, key: tuple, now: datetime, counts: dict[str, int]) -> None:
        with self._lock:
            self._counts[key] = (now, counts)
            self._counts.move_to_end(key)
            while len(self._counts) > self.SIZE:
                self._counts.popitem(last=False)


# The parameters that are the time, not the worker's declarations or the rule's settings.
_TIMES = frozenset({"now", "online_since"})
recent_skips = RecentSkips()


def _skipped(params: dict[str, Any], now: datetime) -> dict[str, int]:
    seconds = settings.POP_SKIPPED_CACHE_SECONDS
    key = RecentSkips.key(params) if seconds > 0 else None
    if key is not None and (counts := recent_skips.get(key, now, seconds)) is not None:
        return counts
    with connection.cursor() as cursor:
        cursor.execute(sql.skipped(), params)
        counts = dict(cursor.fetchall())
    if key is not None:
        recent_skips.put(key, now, counts)
    return counts


def pop_generation(
    *, api_key: str | None, declaration: WorkerDeclaration, now: datetime | None = None, address: str = ""
) -> PoppedJob | EmptyPop:
    """Authenticate the key and check the declared worker in, then claim the best request it
    may serve, if any.

    The claim is one short transaction: lock one request row with SKIP LOCKED so that
    concurrent pops never wait on each other, take up to `declaration.amount` of its jobs and
    start one lease per job.
    """
    now = now or clock.now()
    worker = check_in_worker(api_key=api_key, declaration=declaration, now=now, address=address)
    if worker.paused or worker.account.flagged_at is not None:
        # A moderator paused it, or its account is flagged (`workers.suspicion`): offered
        # nothing, no claim tried.
        return EmptyPop(skipped={}, worker_id=worker.pk, may_wait=False)
    trusted = worker.account.trusted
    cap = leases.cap_seconds(trusted=trusted)
    if worker.capacity_limited:
        metrics.increment_soon(metrics.POP_LEASE_CAPACITY_LIMITED, now=now)
    params = {
        **pop_params(worker, trusted=trusted, now=now),
        "amount": declaration.amount,
        "job_ttl": leases.initial_job_ttl(cap),
        "cap_seconds": cap,
        "capacity": worker.capacity,
        "capacity_limited": worker.capacity_limited,
    }
    # One statement, so one implicit transaction: lock the request, take its jobs, start the
    # leases. Nothing else runs between the lock and the commit.
    request = fetch_instance(TextRequest, sql.claim(), params, extra=sql.CLAIMED, generic_plan=True)
    if request is None:
        if worker.maintenance:
            raise errors.WorkerMaintenance(worker.maintenance_reason or None)
        return EmptyPop(skipped=_skipped(params, now), worker_id=worker.pk)
    request.queued -= request.take
    generations = [
        Generation(
            id=generation_id,
            request=request,
            worker=worker,
            model=request.generation_model,
            popped_at=now,
            job_ttl=params["job_ttl"],
            cap_seconds=cap,
            trusted_at_pop=trusted,
            capacity_at_pop=worker.capacity,
            fallback_tier=request.fallback_tier,
            capacity_limited=worker.capacity_limited,
        )
        for generation_id in request.generation_ids
    ]
    return PoppedJob(request=request, generations=generations)


def pop_params(worker: Worker, *, trusted: bool, now: datetime) -> dict[str, Any]:
    """The values `sql.pop` (and `sql.claim`) take: the rule's, and the popping worker's as it checked in.

    The worker is passed as values rather than joined by id, so that a plan of the pop fits
    every worker and PostgreSQL keeps it (a prepared statement's generic plan) instead of
    planning each pop anew, which was half the pop's database CPU. `plan_hint` is always
    false: see `sql.pop`.
    """
    return {
        **eligibility.params(now),
        "now": now,
        "w_id": worker.pk,
        "w_account_id": worker.account_id,
        "w_speed": worker.speed,
        "w_max_length": worker.max_length,
        "w_max_context_length": worker.max_context_length,
        "w_served_models": worker.served_models,
        "w_maintenance": worker.maintenance,
        "w_chat": worker.chat,
        "w_tools": worker.tools,
        "w_structured_outputs": worker.structured_outputs,
        "w_bridge_agent": worker.bridge_agent,
        "wa_trusted": trusted,
        "plan_hint": False,
    }
