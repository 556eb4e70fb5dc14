"""The text flow: create, pop, submit, cancel and the stale pass.

Each function owns its transaction and takes `now` from `hordeops.clock` unless given.
"""

import json
import logging
import math
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from hordeops import clock, errors, metrics
from hordeops.rows import columns, fetch_instance
from jobs import eligibility, leases, relay
from jobs.models import Generation, TextRequest
from workers.models import Account, Worker
from workers.services import check_in_worker, required_api_key

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock key: one stale pass at a time across every Celery worker.
STALE_PASS_LOCK_KEY = 0x686F726465  # "horde"
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


def prompt_tokens(text: str) -> int:
    """Tokens in a text, estimated as the AI Horde does: about four characters a token."""
    return math.ceil(len(text) / 4)


def estimate_tokens(text: str, max_length: int) -> int:
    """The AI Horde's count of generated tokens ("things"): at least 20, at most max_length."""
    return min(max_length, max(20, prompt_tokens(text)))


def _require_known_models(models: list[str]) -> None:
    """A model is known while some registered worker declares it."""
    if models and not Worker.objects.filter(served_models__overlap=models).exists():
        raise errors.UnknownModel("No worker serves any of the requested models: " + ", ".join(models[:5]))


def lease_cap_seconds(*, trusted: bool) -> int:
    if trusted:
        return settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS
    return settings.UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS


# --- Requests -------------------------------------------------------------------------------


def create_text_request(
    *,
    account: Account,
    prompt: str,
    params: dict[str, Any],
    models: list[str],
    workers: list[UUID],
    trusted_workers: bool,
    slow_workers: bool,
    dry_run: bool,
    deadline_at: datetime | None = None,
    now: datetime | None = None,
) -> tuple[TextRequest | None, float]:
    """Queue a text request; return it (None on a dry run) and its kudos estimate."""
    now = now or clock.now()
    n = params.pop("n", 1)
    max_length = params.get("max_length", 80)
    max_context_length = params.get("max_context_length", 2048)
    if max_context_length < max_length:
        raise errors.TokenOverflow()
    kudos = round(max_length * n / 10, 2)
    _require_known_models(models)
    if workers:
        known = set(Worker.objects.filter(pk__in=workers).values_list("pk", flat=True))
        missing = [str(w) for w in workers if w not in known]
        if missing:
            raise errors.WorkerNotFound(f"No worker with id {missing[0]}.")
    if dry_run:
        return None, kudos
    with transaction.atomic():
        fair_rank = _admit(account)
        request = TextRequest.objects.create(
            account=account,
            kind=TextRequest.Kind.TEXT,
            fair_rank=fair_rank,
            prompt=prompt,
            params=params,
            max_length=max_length,
            max_context_length=max_context_length,
            requested_models=models,
            allowed_workers=workers,
            trusted_workers=trusted_workers,
            slow_workers=slow_workers,
            n=n,
            queued=n,
            created_at=now,
            expires_at=_expiry(now, deadline_at),
            deadline_at=deadline_at,
        )
    return request, kudos


def _admit(account: Account) -> int:
    """Refuse a request past the account's bound of waiting or running requests, or return
    how many the account has: the new request's `fair_rank`.

    The account's row is locked until the caller's transaction ends, so two requests at once
    cannot both take its last place (nor the same rank); the count reads the
    `request_active_by_account` index.
    """
    Account.objects.select_for_update().filter(pk=account.pk).values_list("pk", flat=True).first()
    limit = account.waiting_requests_limit
    active = TextRequest.objects.filter(account_id=account.pk, state=TextRequest.State.ACTIVE)[:limit].count()
    if active >= limit:
        raise errors.TooManyPrompts(count=active, limit=limit)
    return active


def _expiry(now: datetime, deadline_at: datetime | None) -> datetime:
    """A request lives TEXT_REQUEST_LIFETIME_SECONDS, or until its deadline if sooner."""
    lifetime = now + timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    return min(lifetime, deadline_at) if deadline_at else lifetime


def render_chat_prompt(messages: list[dict[str, str]]) -> str:
    """The chat as one ChatML prompt, for workers that take a prompt rather than messages."""
    turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(turns) + "<|im_start|>assistant\n"


def create_chat_request(
    *,
    account: Account,
    model: str,
    messages: list[dict[str, str]],
    max_length: int,
    params: dict[str, Any],
    deadline_at: datetime | None = None,
    now: datetime | None = None,
) -> TextRequest:
    """Queue a chat job for one reply of at most `max_length` tokens from `model`."""
    now = now or clock.now()
    _require_known_models([model])
    prompt = render_chat_prompt(messages)
    with transaction.atomic():
        fair_rank = _admit(account)
        return TextRequest.objects.create(
            account=account,
            kind=TextRequest.Kind.CHAT,
            fair_rank=fair_rank,
            prompt=prompt,
            messages=messages,
            params=params,
            max_length=max_length,
            # The worker must hold the prompt and the whole reply in its context.
            max_context_length=max(20, prompt_tokens(prompt)) + max_length,
            requested_models=[model],
            n=1,
            queued=1,
            created_at=now,
            expires_at=_expiry(now, deadline_at),
            deadline_at=deadline_at,
        )


def commit_stream(*, request_id: UUID, generation_id: UUID) -> bool:
    """Commit the request's stream to one generation's output, if it is still running.

    From here on an abort faults the request instead of restarting it. The generation row
    is locked first, in the order the stale pass and the submit lock (generation, then
    request): either the pass aborted it before, and nothing is committed, or it aborts it
    after and sees the commitment.
    """
    with transaction.atomic():
        running = list(
            Generation.objects.select_for_update(no_key=True)
            .filter(pk=generation_id, request_id=request_id, state=Generation.State.PROCESSING)
            .values_list("pk", flat=True)
        )
        if not running:
            return False
        committed = TextRequest.objects.filter(
            pk=request_id, state=TextRequest.State.ACTIVE, stream_generation=None
        ).update(stream_generation=generation_id)
    return committed == 1


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


# --- Pop ---------------------------------------------------------------------------------------


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
    cap = lease_cap_seconds(trusted=trusted)
    if worker.capacity_limited:
        metrics.increment(metrics.POP_LEASE_CAPACITY_LIMITED, now=now)
    params = {
        **pop_params(worker, trusted=trusted, now=now),
        "amount": amount,
        "job_ttl": min(settings.TEXT_JOB_LEASE_SECONDS, cap),
        "cap_seconds": cap,
        "capacity": worker.capacity,
        "capacity_limited": worker.capacity_limited,
    }
    # One statement, so one implicit transaction: lock the request, take its jobs, start the
    # leases. Nothing else runs between the lock and the commit.
    request = fetch_instance(TextRequest, _claim_sql(), params, extra=_CLAIMED)
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
    """The values `_pop_sql` takes: the rule's, and the popping worker's as it checked in.

    The worker is passed as values rather than joined by id, so that a plan of the pop fits
    every worker and PostgreSQL keeps it (a prepared statement's generic plan) instead of
    planning each pop anew, which was half the pop's database CPU. `plan_hint` is always
    false: see `_pop_sql`.
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


@cache
def _pop_sql() -> str:
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
        WHERE r.state = 'active' AND r.queued > 0
          AND ((r.expires_at > %(now)s AND {eligibility.offer_sql("r", "w", "wa")})
               OR %(plan_hint)s::boolean)
        ORDER BY r.fair_rank ASC, r.priority DESC, r.created_at ASC
        LIMIT 1
        FOR UPDATE OF r SKIP LOCKED
    """


@cache
def _claim_sql() -> str:
    """Lock the best request (`_pop_sql`), take up to `amount` of its jobs, insert their
    generations; return the request with `take`, `generation_ids` and `generation_model`.

    The model is the first the worker serves that the request asks for (or the worker's
    first, for a request that names none).
    """
    g = Generation._meta.db_table
    # Whitespace folded: under 4 KiB, psycopg caches the statement's parsing.
    return _folded(f"""
        WITH picked AS ({_pop_sql()}),
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
            SELECT gen_random_uuid(), p.id, %(w_id)s, c.model, 'processing', %(now)s, %(job_ttl)s,
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


# --- Submit ------------------------------------------------------------------------------------


def _refusal(generation_id: UUID) -> errors.DomainError:
    """The error for a submit or progress post on a generation that is no longer processing."""
    generation = Generation.objects.filter(pk=generation_id).first()
    if generation is None:
        return errors.InvalidJobID()
    if generation.state == Generation.State.DONE:
        return errors.DuplicateGen()
    if generation.state == Generation.State.CANCELLED:
        return errors.GenerationCancelled()
    if generation.state == Generation.State.FAULTED:
        return errors.AbortedGen("This generation was given back as faulted and cannot be submitted.")
    return errors.AbortedGen(
        "This generation took too long to process and has been aborted as stale: "
        f"{generation.lease_description()}. "
        "Post progress while generating to renew the lease, or serve shorter jobs."
    )


def _too_long(text_request: TextRequest) -> errors.OutputTooLong:
    return errors.OutputTooLong(
        f"This job asked for at most {text_request.max_length} tokens, so its output may be at most "
        f"{text_request.output_limit_bytes} bytes of UTF-8 in all "
        f"({TextRequest.OUTPUT_BYTES_PER_TOKEN} a token plus {TextRequest.OUTPUT_ALLOWANCE_BYTES}).",
        limit_bytes=text_request.output_limit_bytes,
    )


def _refuse_past_deadline(text_request: TextRequest, now: datetime) -> None:
    """Past the requester's deadline the job is cancelled, whatever the pass has done yet."""
    if text_request.deadline_at and now >= text_request.deadline_at:
        cancel_request(request_id=text_request.pk, reason=errors.GenerationDeadlineExceeded.code, now=now)
        raise errors.GenerationCancelled("The requester's generation deadline ran out.")


@dataclass(frozen=True)
class ProgressResult:
    lease: str  # granted, at_cap, not_renewed or lapsed
    expires_at: datetime
    ttl: int  # whole seconds left


def record_progress(
    *,
    api_key: str | None,
    generation_id: UUID,
    seq: int,
    delta: str,
    tokens: int | None,
    now: datetime | None = None,
) -> ProgressResult:
    """Relay a chat worker's new output and renew its lease when the output is new.

    The Lua script decides and relays atomically in Redis; a granted renewal is then written
    to the generation row as its new job_ttl, which is what the stale pass reads. If the pass
    aborted the generation in between, the write finds it gone: the lease is killed and the
    worker told, so that no generation is ever aborted with a live stream lease.
    """
    now = now or clock.now()
    generation = _posted_generation(api_key=api_key, generation_id=generation_id)
    if generation.state != Generation.State.PROCESSING:
        raise _refusal(generation.pk)
    if generation.request.kind != TextRequest.Kind.CHAT:
        raise errors.BadRequest("Progress posts are for chat jobs; a text job keeps its flat lease.")
    _refuse_past_deadline(generation.request, now)
    renewal = leases.renew(
        generation_id=generation.pk,
        request_id=generation.request_id,
        popped_at=generation.popped_at,
        job_ttl=generation.job_ttl,
        cap_seconds=generation.cap_seconds,
        trusted=generation.trusted_at_pop,
        seq=seq,
        delta=delta,
        tokens=tokens,
        output_limit=generation.request.output_limit_bytes,
        now=now,
    )
    outcome = renewal.outcome
    if outcome == "dead":
        raise _refusal(generation.pk)
    if outcome == "too_long":
        raise _too_long(generation.request)
    if outcome == "gap":
        raise errors.ProgressOutOfOrder(
            f"Progress seq {seq} skips ahead: the last accepted seq is {renewal.last_seq}.",
            last_seq=renewal.last_seq,
        )
    if outcome == "granted":
        # The Redis lease end to the millisecond, rounded up (never short of it; the rounding
        # to microseconds first drops float noise) and never past the cap.
        seconds = round(renewal.lease_end - generation.popped_at.timestamp(), 6)
        job_ttl = min(generation.cap_seconds, math.ceil(seconds * 1000) / 1000)
        with connection.cursor() as cursor:
            cursor.execute(_RENEW_SQL, [job_ttl, generation.pk])
            written = cursor.rowcount
        if not written:
            leases.kill([generation.pk])
            raise _refusal(generation.pk)
    if outcome == "retry":
        outcome = "lapsed" if now.timestamp() > renewal.lease_end else "not_renewed"
    return ProgressResult(
        lease=outcome,
        expires_at=renewal.expires_at,
        ttl=max(0, math.floor(renewal.lease_end - now.timestamp())),
    )


def _posted_generation(*, api_key: str | None, generation_id: UUID) -> Generation:
    """The generation a worker posts to, once the key is known and owns its worker.

    The key is checked in the generation's own statement: a bad key is refused before a bad
    id, as when authenticating came first."""
    post = Generation.objects.for_worker_post(generation_id, api_key=required_api_key(api_key))
    if post is None:
        raise errors.InvalidAPIKey()
    generation = post.generation
    if generation is None:
        raise errors.InvalidJobID()
    if generation.worker.account_id != post.caller.id:
        raise errors.WrongCredentials()
    return generation


# The lease a granted renewal moved, written where the stale pass reads it (raw: the ORM's
# compiling of this update cost more than running it).
_RENEW_SQL = (
    f"UPDATE {Generation._meta.db_table} SET job_ttl = %s, renewals = renewals + 1"
    " WHERE id = %s AND state = 'processing'"
)


def submit_generation(
    *,
    api_key: str | None,
    generation_id: UUID,
    text: str,
    state: str,
    seed: int,
    gen_metadata: list[dict[str, Any]],
    now: datetime | None = None,
) -> float:
    """Accept a worker's result, or its giving the job back; return the reward."""
    now = now or clock.now()
    generation = _posted_generation(api_key=api_key, generation_id=generation_id)
    _refuse_past_deadline(generation.request, now)
    if state == "faulted":
        _give_back(generation, now)
        return 0.0

    text_request = generation.request
    if len(text.encode()) > text_request.output_limit_bytes:
        raise _too_long(text_request)
    tokens = estimate_tokens(text, text_request.max_length)
    if text_request.kind == TextRequest.Kind.CHAT:
        # A streaming worker's own running count beats the four-characters estimate.
        reported = leases.state(generation.pk).get("tokens")
        tokens = int(reported) if reported else tokens
    elapsed = max((now - generation.popped_at).total_seconds(), 0.001)
    reward = round(tokens / 10, 2)
    # One statement, so one implicit transaction: the compare-and-set on the generation (of
    # this submit and the stale pass, whichever gets the row first wins; the other sees
    # state != processing and changes nothing), the request's count and the worker's speed.
    with connection.cursor() as cursor:
        cursor.execute(
            _ACCEPT_SQL,
            {
                "id": generation.pk,
                "now": now,
                "text": text,
                "result": state,
                "seed": seed,
                "gen_metadata": json.dumps(gen_metadata),
                "tokens": tokens,
                "reward": reward,
                "sample": tokens / elapsed,
                "window": Worker.SPEED_WINDOW,
            },
        )
        (accepted,) = cursor.fetchone()
    if not accepted:
        raise _refusal(generation.pk)
    if text_request.kind == TextRequest.Kind.CHAT:
        finish = "length" if tokens >= text_request.max_length else "stop"
        transaction.on_commit(
            lambda: _relay_done(text_request.pk, generation.pk, text=text, tokens=tokens, finish=finish)
        )
    return reward


_ACCEPT_SQL = f"""
    WITH accepted AS (
        UPDATE {Generation._meta.db_table} SET
            state = 'done', finished_at = %(now)s, text = %(text)s, result = %(result)s,
            seed = %(seed)s, gen_metadata = %(gen_metadata)s::jsonb, tokens = %(tokens)s,
            reward = %(reward)s
        WHERE id = %(id)s AND state = 'processing'
        RETURNING request_id, worker_id
    ),
    counted AS (
        UPDATE {TextRequest._meta.db_table} AS t SET
            finished = t.finished + 1,
            state = CASE WHEN t.state = 'active' AND t.finished >= t.n - 1 AND t.queued = 0
                         THEN 'done' ELSE t.state END
        FROM accepted AS a WHERE t.id = a.request_id
        RETURNING t.id
    ),
    -- The speed is computed from the row itself, so concurrent submits by one worker both land.
    measured AS (
        UPDATE {Worker._meta.db_table} AS w SET
            speed_samples = (w.speed_samples || %(sample)s::float8)
                [greatest(1, cardinality(w.speed_samples) + 2 - %(window)s):],
            speed = (SELECT avg(x) FROM unnest(
                (w.speed_samples || %(sample)s::float8)
                    [greatest(1, cardinality(w.speed_samples) + 2 - %(window)s):]) AS x),
            completed_jobs = w.completed_jobs + 1
        FROM accepted AS a WHERE w.id = a.worker_id
        RETURNING w.id
    )
    -- Data-modifying WITH statements always run to completion, read or not.
    SELECT count(*) FROM accepted
"""


def _relay_done(request_id: UUID, generation_id: UUID, *, text: str, tokens: int, finish: str) -> None:
    leases.kill([generation_id])
    relay.publish(request_id, relay.DONE, generation_id, text=text, tokens=tokens, finish_reason=finish)


def _give_back(generation: Generation, now: datetime) -> None:
    """`state: "faulted"`: the worker returns the job; restart it and count an abort."""
    with transaction.atomic():
        given_back = Generation.objects.filter(pk=generation.pk, state=Generation.State.PROCESSING).update(
            state=Generation.State.FAULTED, finished_at=now
        )
        if not given_back:
            raise _refusal(generation.pk)
        outcomes = _restart_requests(Tally([generation.request_id]))
        _count_aborts(Tally([generation.worker_id]), now)
        transaction.on_commit(lambda: _relay_restarts(outcomes, [(generation.request_id, generation.pk)]))


# --- The stale pass ----------------------------------------------------------------------------


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
            # The lapse test (`Generation.objects.stale(now)`, spelled out) must sit in this
            # UPDATE's own WHERE: a renewal committed while the pass waits on the row lock is
            # then re-checked against the renewed job_ttl. A subquery would not be re-checked.
            cursor.execute(
                f"""
                UPDATE {Generation._meta.db_table} SET state = %(aborted)s, finished_at = %(now)s
                WHERE state = %(processing)s
                  AND popped_at + interval '1 second' * job_ttl < %(now)s
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


def _count_stale_aborts(by_trust: Tally, now: datetime) -> None:
    for trust, count in by_trust.items():
        metrics.increment(metrics.STALE_ABORTS, trust, amount=count, now=now)


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
    expired = "(w.aborts_window_start IS NULL OR w.aborts_window_start <= %(window_start)s)"
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
                "window_start": now - timedelta(hours=1),
                "threshold": settings.WORKER_ABORT_MAINTENANCE_THRESHOLD,
                "reason": MAINTENANCE_REASON,
            },
        )
        return [name for name, in_maintenance in cursor.fetchall() if in_maintenance]
