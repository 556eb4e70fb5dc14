"""A worker's submit: accept its result once, or take the job back when it gives it up."""

import json
import logging
from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from hordeops import clock, errors, metrics
from jobs import affinity, claims, leases, relay, sql, webhooks
from jobs.models import Ending, Generation
from jobs.protocols import agents
from jobs.services.endings import AbortedJob, relay_restarts, restart_requests
from jobs.services.posts import (
    output_too_long,
    posted_generation,
    refusal,
    refuse_past_deadline,
    requester_lost,
)
from jobs.services.requests import estimate_tokens
from jobs.services.settlement import settle
from kudos import sizes
from workers import suspicion
from workers.models import Suspicion, Worker
from workers.services import count_aborts

logger = logging.getLogger(__name__)


def submit_generation(
    *,
    api_key: str | None,
    generation_id: UUID,
    text: str,
    state: str,
    seed: int,
    gen_metadata: list[dict[str, Any]],
    now: datetime | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> float:
    """Accept a worker's result, or its giving the job back; return the reward: the kudos
    posted to the worker's owner (`kudos.earning`).

    The job of a request cancelled meanwhile (by its requester or its deadline) is refused
    with GenerationCancelled, which tells a chat worker to stop; a legacy worker's submit of it
    is accepted instead, as the AI Horde accepts it, with a reward of 0, and its text goes to no
    one: the official worker retries any other answer for ~22 s before it gives up. Neither counts
    against the worker.

    `tool_calls`: a chat reply's calls of the job's tools. A reply that breaks what its job
    asked for (`agents.check_reply`: arguments that are not a JSON object, a reply that is not
    the JSON asked for) is given back as a `faulted` submit is, and refused ReplyBreaksJob."""
    now = now or clock.now()
    generation = posted_generation(api_key=api_key, generation_id=generation_id)
    try:
        return _submit(
            generation,
            text=text,
            state=state,
            seed=seed,
            gen_metadata=gen_metadata,
            now=now,
            tool_calls=tool_calls or [],
        )
    except errors.GenerationCancelled:
        if generation.worker.chat:
            raise
        return 0.0  # its text goes to no one, and nothing counts it towards the worker's totals


def _submit(
    generation: Generation,
    *,
    text: str,
    state: str,
    seed: int,
    gen_metadata: list[dict[str, Any]],
    now: datetime,
    tool_calls: list[dict[str, Any]],
) -> float:
    refuse_past_deadline(text_request=generation.request, now=now)
    if state == "faulted":
        _give_back(generation, now)
        return 0.0

    text_request = generation.request
    calls: list[dict[str, Any]] = []
    judged = tool_calls or text_request.needs_tools or text_request.needs_structured_outputs
    if state == "ok" and judged:
        try:
            calls = agents.worker_calls(tool_calls)
            agents.check_reply(text_request.params, text, calls)
        except agents.BadReply as err:
            _give_back(generation, now)
            raise errors.ReplyBreaksJob(f"{err} The job was given to another worker.") from None
    # What the reply holds, as its size and its tokens are counted: its text and its calls.
    counted = text + "".join(call["function"]["name"] + call["function"]["arguments"] for call in calls)
    if len(counted.encode()) > text_request.output_limit_bytes:
        raise output_too_long(text_request=text_request)
    tokens = estimate_tokens(counted, text_request.max_length)
    if text_request.relayed:
        reported, follower_gone = leases.at_submit(generation)
        if follower_gone:
            raise requester_lost(text_request=text_request, generation_id=generation.pk, now=now)
        # A streaming worker's own running count beats the four-characters estimate, within
        # what it handed in.
        if reported:
            tokens = claims.tokens(
                int(reported), max_length=text_request.max_length, output_bytes=len(counted.encode())
            )
    settlement = settle(generation, tokens=tokens, result=state, now=now)
    # One statement, so one implicit transaction (`sql.accept`): the generation's
    # compare-and-set, the request's count, the worker's speed and the kudos it settles.
    with connection.cursor() as cursor:
        cursor.execute(
            sql.accept(),
            {
                "id": generation.pk,
                "now": now,
                "text": text,
                "turn_key": affinity.turn_key(text_request.account_id),
                "turn_end": affinity.CHAT_TURN_END,
                "result": state,
                "seed": seed,
                "gen_metadata": json.dumps(gen_metadata),
                "tokens": tokens,
                "reward": settlement.earned,
                "cost": settlement.cost,
                "sample": claims.speed_sample(
                    tokens=tokens, seconds=(now - generation.popped_at).total_seconds()
                ),
                "window": Worker.SPEED_WINDOW,
                # The context this job showed the worker serves (`Worker.served_context`).
                "context": min(text_request.max_context_length, text_request.prompt_tokens + tokens),
                **settlement.params,
            },
        )
        accepted, turn_length, turn_digest = cursor.fetchone()
    if not accepted:
        raise refusal(generation_id=generation.pk)
    _suspect_speed(generation, tokens=tokens, now=now)
    if text_request.webhook:  # posted by a Celery worker: a slow hook never slows the submit
        transaction.on_commit(lambda: webhooks.queue_delivery(generation.pk), robust=True)
    if text:
        transaction.on_commit(
            lambda: affinity.remember(
                account_id=text_request.account_id,
                length=turn_length,
                digest=turn_digest,
                worker_id=generation.worker_id,
            ),
            robust=True,
        )
    if text_request.relayed:
        finish = "tool_calls" if calls else "length" if tokens >= text_request.max_length else "stop"
        # robust: the result is accepted once committed, Redis or not; the answer says so.
        transaction.on_commit(
            lambda: _relay_done(
                text_request.pk,
                generation.pk,
                text=text,
                tokens=tokens,
                finish=finish,
                kudos=settlement.cost,
                model=generation.model,
                calls=calls,
            ),
            robust=True,
        )
    return float(settlement.earned)


def _suspect_speed(generation: Generation, *, tokens: int, now: datetime) -> None:
    """An untrusted worker's job delivered faster than its model's size allows is a suspicion
    (`workers.suspicion`): a statement more only then."""
    if generation.worker.account.trusted or tokens < suspicion.JUDGED_MIN_TOKENS:
        return
    ceiling = suspicion.speed_ceiling(generation.model, sizes.billions(generation.model))
    seconds = (now - generation.popped_at).total_seconds()
    if ceiling is None or tokens <= ceiling * seconds:
        return
    speed = tokens / max(seconds, 0.001)
    suspicion.report(
        account_id=generation.worker.account_id,
        worker_id=generation.worker_id,
        reason=Suspicion.Reason.UNREASONABLY_FAST,
        detail=f"{speed:.0f} t/s > {ceiling:.0f} t/s for {generation.model}",
        now=now,
    )


def _relay_done(
    request_id: UUID,
    generation_id: UUID,
    *,
    text: str,
    tokens: int,
    finish: str,
    kudos: Decimal,
    model: str,
    calls: list[dict[str, Any]],
) -> None:
    leases.kill([generation_id])
    # The calls only where there are some: a plain reply's event is as it always was.
    extra = {"tool_calls": json.dumps(calls, separators=(",", ":"))} if calls else {}
    relay.publish(
        request_id,
        relay.DONE,
        generation_id,
        text=text,
        tokens=tokens,
        finish_reason=finish,
        kudos=kudos,
        model=model,  # the requester's answer names it: one of its fallbacks may have served
        **extra,
    )


def _give_back(generation: Generation, now: datetime) -> None:
    """`state: "faulted"`: the worker returns the job; restart it and count an abort."""
    with transaction.atomic():
        given_back = Generation.objects.filter(pk=generation.pk, state=Generation.State.PROCESSING).update(
            state=Generation.State.FAULTED, finished_at=now
        )
        if not given_back:
            raise refusal(generation_id=generation.pk)
        restarts = restart_requests(
            counts=Counter([generation.request_id]), after_commit=Ending.GIVEN_BACK, now=now
        )
        count_aborts(counts=Counter([generation.worker_id]), now=now, given_back=True)
        trust = metrics.trust_label(generation.worker.account.trusted)
        aborted = [AbortedJob(request_id=generation.request_id, generation_id=generation.pk)]

        # robust: committed, the give-back has happened, so it is not answered 503 if Redis
        # fails now; the lease left in Redis is dead anyway, as the row says (`refusal`).
        def after_commit() -> None:
            metrics.increment(metrics.GIVE_BACKS, trust, now=now)
            relay_restarts(restarts=restarts, aborted=aborted)

        transaction.on_commit(after_commit, robust=True)
