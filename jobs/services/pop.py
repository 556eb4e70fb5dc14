"""The pop: check the worker in, then claim the first request it may be offered, in one statement."""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from hordeops import clock, errors, metrics
from hordeops.rows import fetch_instance
from jobs import eligibility, leases, sql
from jobs.models import Generation, TextRequest
from workers.models import Worker
from workers.services import check_in_worker

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


def pop_generation(
    *,
    api_key: str | None,
    name: str,
    models: list[str],
    max_length: int,
    max_context_length: int,
    threads: int,
    nsfw: bool,
    chat: bool,
    bridge_agent: str,
    amount: int,
    now: datetime | None = None,
) -> PoppedJob | EmptyPop:
    """Authenticate the key and check the worker in, then claim the best request it may
    serve, if any.

    The claim is one short transaction: lock one request row with SKIP LOCKED so that
    concurrent pops never wait on each other, take up to `amount` of its jobs and start
    one lease per job.
    """
    now = now or clock.now()
    worker = check_in_worker(
        api_key=api_key,
        name=name,
        served_models=models,
        max_length=max_length,
        max_context_length=max_context_length,
        threads=threads,
        nsfw=nsfw,
        chat=chat,
        bridge_agent=bridge_agent,
        now=now,
    )
    trusted = worker.account.trusted
    cap = leases.cap_seconds(trusted=trusted)
    if worker.capacity_limited:
        metrics.increment(metrics.POP_LEASE_CAPACITY_LIMITED, now=now)
    params = {
        **pop_params(worker, trusted=trusted, now=now),
        "amount": amount,
        "job_ttl": leases.initial_job_ttl(cap),
        "cap_seconds": cap,
        "capacity": worker.capacity,
        "capacity_limited": worker.capacity_limited,
    }
    # One statement, so one implicit transaction: lock the request, take its jobs, start the
    # leases. Nothing else runs between the lock and the commit.
    request = fetch_instance(TextRequest, sql.claim(), params, extra=sql.CLAIMED)
    if request is None:
        if worker.maintenance:
            raise errors.WorkerMaintenance(worker.maintenance_reason or None)
        with connection.cursor() as cursor:
            cursor.execute(sql.skipped(), params)
            return EmptyPop(skipped=dict(cursor.fetchall()))
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
        "wa_trusted": trusted,
        "plan_hint": False,
    }
