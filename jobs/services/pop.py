"""The pop: check the worker in, then claim the first request it may be offered, in one statement."""

import logging
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from hordeops import clock, errors, metrics
from hordeops.rows import columns, fetch_instance
from jobs import eligibility, leases
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
) -> PoppedJob | None:
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
    request = fetch_instance(TextRequest, claim_sql(), params, extra=_CLAIMED)
    if request is None:
        if worker.maintenance:
            raise errors.WorkerMaintenance(worker.maintenance_reason or None)
        return None
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
    """The values `pop_sql` takes: the rule's, and the popping worker's as it checked in.

    The worker is passed as values rather than joined by id, so that a plan of the pop fits
    every worker and PostgreSQL keeps it (a prepared statement's generic plan) instead of
    planning each pop anew, which was half the pop's database CPU. `plan_hint` is always
    false: see `pop_sql`.
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


# The states the statements test and write, from the models' choices.
_ACTIVE, _PROCESSING = TextRequest.State.ACTIVE.value, Generation.State.PROCESSING.value


@cache
def pop_sql() -> str:
    """The best request this worker may be offered now, locked; with its tier for it.

    Queue order is fair across accounts, then priority, then age (`fair_rank`: an account's
    waiting or running requests when the request was queued), on the partial index
    `request_pop_queue`; SKIP LOCKED
    lets concurrent pops pass each other's rows instead of waiting or taking one twice.

    `OR %(plan_hint)s` (always false) is a hint for the generic plan, which does not know
    the worker's values: it would guess that almost no request passes the offer rule, and
    then read every live request by expiry and sort them (close to a second at 100,000
    queued) rather than walk the queue index to the first offer (under a millisecond). A
    condition that may be true makes it guess that many pass, and walk the index. With the
    value known, as in a custom plan, the hint folds away.
    """
    return f"""
        SELECT r.*, {eligibility.tier_sql("r", "w", "wa")} AS fallback_tier
        FROM {TextRequest._meta.db_table} AS r,
             (SELECT %(w_id)s::uuid AS id, %(w_account_id)s::bigint AS account_id,
                     %(w_speed)s::double precision AS speed, %(w_max_length)s::integer AS max_length,
                     %(w_max_context_length)s::integer AS max_context_length,
                     %(w_served_models)s::varchar[] AS served_models,
                     %(w_maintenance)s::boolean AS maintenance, %(w_chat)s::boolean AS chat) AS w,
             (SELECT %(wa_trusted)s::boolean AS trusted) AS wa
        WHERE r.state = '{_ACTIVE}' AND r.queued > 0
          AND ((r.expires_at > %(now)s AND {eligibility.offer_sql("r", "w", "wa")})
               OR %(plan_hint)s::boolean)
        ORDER BY r.fair_rank ASC, r.priority DESC, r.created_at ASC
        LIMIT 1
        FOR UPDATE OF r SKIP LOCKED
    """


@cache
def claim_sql() -> str:
    """Lock the best request (`pop_sql`), take up to `amount` of its jobs, insert their
    generations; return the request with `take`, `generation_ids` and `generation_model`.

    The model is the first the worker serves that the request asks for (or the worker's
    first, for a request that names none).
    """
    g = Generation._meta.db_table
    # Whitespace folded: under 4 KiB, psycopg caches the statement's parsing.
    return _folded(f"""
        WITH picked AS ({pop_sql()}),
        taken AS (
            UPDATE {TextRequest._meta.db_table} AS t
            SET queued = t.queued - LEAST(%(amount)s, p.queued)
            FROM picked AS p WHERE t.id = p.id
            RETURNING t.id, LEAST(%(amount)s, p.queued) AS take
        ),
        chosen AS (
            SELECT COALESCE((
                SELECT m FROM unnest(%(w_served_models)s::varchar[]) WITH ORDINALITY AS s(m, i)
                WHERE cardinality(p.requested_models) = 0 OR m = ANY(p.requested_models)
                ORDER BY i LIMIT 1), '') AS model
            FROM picked AS p
        ),
        started AS (
            INSERT INTO {g} (
                id, request_id, worker_id, model, state, popped_at, job_ttl, cap_seconds,
                trusted_at_pop, renewals, capacity_at_pop, fallback_tier, capacity_limited,
                settlement_information, finished_at, text, result, seed, gen_metadata, tokens, reward)
            SELECT gen_random_uuid(), p.id, %(w_id)s, c.model, '{_PROCESSING}', %(now)s, %(job_ttl)s,
                   %(cap_seconds)s, %(wa_trusted)s, 0, %(capacity)s, p.fallback_tier,
                   %(capacity_limited)s, NULL, NULL, NULL, '', NULL, '[]', NULL, 0
            FROM picked AS p, taken AS t, chosen AS c, generate_series(1, t.take)
            RETURNING id
        )
        SELECT {columns(TextRequest, "p")}, p.fallback_tier, t.take, c.model,
               ARRAY(SELECT id FROM started)
        FROM picked AS p, taken AS t, chosen AS c
    """)


# What the claim returns after the request's own columns, in order.
_CLAIMED = ("fallback_tier", "take", "generation_model", "generation_ids")


def _folded(sql: str) -> str:
    """The statement on one line (it holds no comments, and no literal with spaces in it)."""
    assert "--" not in sql
    return " ".join(sql.split())
