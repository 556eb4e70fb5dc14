"""How requests and generations end: cancellation, restarts after an abort or a give-back,
and the relay events that tell waiting requesters."""

import json
import logging
import math
from collections import Counter
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django_redis import get_redis_connection

from hordeops import clock, errors
from jobs import claims, leases, relay, sql, waits
from jobs.models import Ending, Generation, TextRequest
from jobs.services.settlement import settle
from kudos import holds, ledger
from workers.models import Worker

logger = logging.getLogger(__name__)


def cancel_account_requests(*, account_id: int, now: datetime | None = None) -> int:
    """Cancel every open request of the account (a suspension's), each as its requester's
    cancellation would; return how many were cancelled."""
    return cancel_requests(requests=TextRequest.objects.filter(account_id=account_id), now=now)


def cancel_requests(*, requests, now: datetime | None = None) -> int:
    """Cancel the open requests among `requests` (a moderator's bulk cancellation, a
    suspension's), each in its own transaction as its requester's cancellation would be, so
    that a stream waiting on one ends with its error event; return how many were cancelled."""
    now = now or clock.now()
    open_ids = list(requests.filter(state=TextRequest.State.ACTIVE).values_list("pk", flat=True))
    cancelled = 0
    for request_id in open_ids:
        if cancel_request(request_id=request_id, now=now).state == TextRequest.State.CANCELLED:
            cancelled += 1
    return cancelled


def cancel_request(
    *, request_id: UUID, reason: Ending = Ending.CANCELLED, now: datetime | None = None
) -> TextRequest:
    """Drop the request's queued work and cancel its running generations.

    `reason` is the request's ending, which its waiting requester and the settlement record are
    told. Nothing restarts a cancelled job.
    A requester's cancellation of a request already past its lifetime or deadline expires it
    instead, as the stale pass would have: its ending was the deadline's, not the requester's.
    """
    now = now or clock.now()
    with transaction.atomic():
        # Its running generations first, then the request: the order the submit and the stale
        # pass lock them in (generation, then request), so that a cancellation and a submit
        # never wait on each other in a cycle.
        _lock_running(request_id)
        request = TextRequest.objects.select_for_update().filter(pk=request_id).first()
        if request is None:
            raise errors.RequestNotFound()
        if reason == Ending.CANCELLED and request.is_past_expiry(now):
            _expire(request, now)
        elif request.state == TextRequest.State.ACTIVE:
            request.state = TextRequest.State.CANCELLED
            request.queued = 0
            request.ending = reason
            request.save(update_fields=["state", "queued", "ending"])
            holds.release(request_ids=[request.pk])
            # With any popped while it waited for the request; one whose submit or abort holds it
            # now is left to them (it waits for this request), or they would wait on each other.
            running = _lock_running(request_id, skip_locked=True)
            _cancel_generations({generation_id: request.max_length for generation_id in running}, reason, now)
            failures = [(request.pk, reason)] if request.relayed else []
            # Robust: with Redis down the cancellation still commits; the leases then expire.
            transaction.on_commit(lambda: _end_streams(failures, running), robust=True)
    return request


def _lock_running(request_id: UUID, *, skip_locked: bool = False) -> list[UUID]:
    """Lock the request's processing generations, in id order; their ids."""
    running = Generation.objects.filter(request_id=request_id, state=Generation.State.PROCESSING)
    locked = running.select_for_update(no_key=True, skip_locked=skip_locked).order_by("pk")
    return list(locked.values_list("pk", flat=True))


def current_request(*, request_id: UUID, now: datetime | None = None) -> TextRequest:
    """The request as it stands now: one past its lifetime or deadline is expired on the spot
    (what the next stale pass would do), so that its status is final the moment it passes."""
    now = now or clock.now()
    request = TextRequest.objects.filter(pk=request_id).first()
    if request is None:
        raise errors.RequestNotFound()
    if request.is_past_expiry(now):
        with transaction.atomic():
            _expire(request, now)
    return request


def _expire(request: TextRequest, now: datetime) -> None:
    """Expire this one request as the stale pass would, in the caller's transaction."""
    with connection.cursor() as cursor:
        expire_past(cursor, now=now, request_id=request.pk)
    request.refresh_from_db()


class Expiry(NamedTuple):
    requests: list[UUID]  # expired
    generations: list[UUID]  # cancelled with them


def expire_past(cursor, *, now: datetime, request_id: UUID | None = None) -> Expiry:
    """Expire the active requests past their lifetime or deadline (every one, or `request_id`'s),
    cancelling their running generations with the reason; their streams are ended once the
    caller's transaction commits. Nothing restarts them."""
    params = {"now": now, "request_id": request_id}
    one = request_id is not None
    cursor.execute(sql.ending_generations(one), params)
    ending = cursor.fetchall()
    for why in {why for _, why, _ in ending}:
        _cancel_generations({g: length for g, w, length in ending if w == why}, Ending(why), now)
    cancelled = [generation_id for generation_id, _, _ in ending]
    cursor.execute(sql.expire_requests(one), params)
    expired = cursor.fetchall()
    chats = [(expired_id, why) for expired_id, relayed, why in expired if relayed]
    # robust: the expiry has committed; Redis failing now must not make it look undone.
    transaction.on_commit(lambda: _end_streams(chats, cancelled), robust=True)
    return Expiry(requests=[expired_id for expired_id, _, _ in expired], generations=cancelled)


# Cancellations the database could not take when they were made (it was down), by request
# id: every web process records its own here, and the stale pass makes them all.
DEFERRED_KEY = "hordeops:deferred-cancellations"


def defer_cancellations(*, reasons: dict[UUID, Ending]) -> None:
    """Record cancellations for `cancel_deferred`, where any process (the stale pass) finds them."""
    if reasons:
        _redis().hset(
            DEFERRED_KEY, mapping={str(request_id): reason for request_id, reason in reasons.items()}
        )


def cancel_deferred(*, pending: dict[UUID, Ending] | None = None, now: datetime | None = None) -> list[UUID]:
    """Make the cancellations that waited for the database: those recorded in Redis and
    `pending` (a process's own, which Redis may not hold if it was down too). Returns the
    requests dealt with. Raises DatabaseError while the database is still away."""
    reasons = dict(pending or {})
    try:
        stored = _redis().hgetall(DEFERRED_KEY)
    except redis.exceptions.RedisError:
        stored = {}
    reasons.update({UUID(key.decode()): Ending(value.decode()) for key, value in stored.items()})
    for request_id, reason in reasons.items():
        try:
            cancel_request(request_id=request_id, reason=reason, now=now)
        except errors.RequestNotFound:
            pass
    if stored:
        try:
            _redis().hdel(DEFERRED_KEY, *stored)
        except redis.exceptions.RedisError:
            pass  # made again next time: cancelling a cancelled request changes nothing
    if reasons:
        logger.info("made %d cancellations that waited for the database", len(reasons))
    return list(reasons)


def cancel_unfollowed(*, now: datetime | None = None) -> list[UUID]:
    """Cancel the active relayed requests whose follower is gone (`jobs.relay.followers_gone`:
    its web process died), those no worker's post has found yet included. Returns them."""
    active = list(TextRequest.objects.relayed_active().values_list("pk", flat=True))
    try:
        gone = relay.followers_gone(active)
    except redis.exceptions.RedisError:
        return []  # unknown now; the next pass asks again
    for request_id in gone:
        cancel_request(request_id=request_id, reason=Ending.UNAVAILABLE, now=now)
    if gone:
        logger.info("cancelled %d requests whose requester's web process is gone", len(gone))
    return list(gone)


def _redis():
    return get_redis_connection("default")


def _cancel_generations(max_lengths: dict[UUID, int], reason: Ending, now: datetime) -> None:
    """Cancel generations in workers' hands (each with its request's max_length), keeping
    their settlement information.

    Usage is unknown (the worker never confirmed a final count); the tokens relayed are the
    worker's last reported count within what it relayed (`jobs.claims`), or the relayed bytes
    / 4. No text is kept. A generation cancelled after it relayed output settles for those
    tokens (`kudos.earning`): its worker's owner is paid for what was delivered, and its
    requester charged for it unless the horde itself lost the stream (`Ending.UNAVAILABLE`:
    Redis, the database or the requester's web process), when nobody may have received it.
    """
    if not max_lengths:
        return
    generation_ids = list(max_lengths)
    settlement = []
    delivered: dict[UUID, int] = {}
    try:
        states = leases.states(generation_ids)
    except redis.exceptions.RedisError:
        # Redis is down (the cancellation may be because of it): what was relayed is unknown.
        states = [None] * len(generation_ids)
    for generation_id, lease in zip(generation_ids, states, strict=True):
        if lease is None:
            relayed = None
        else:
            output_bytes = int(lease.get("output_len", 0))
            relayed = (
                claims.tokens(
                    int(lease["tokens"]), max_length=max_lengths[generation_id], output_bytes=output_bytes
                )
                if lease.get("tokens")
                else math.ceil(output_bytes / 4)
            )
        settlement.append(
            json.dumps({"usage": "unknown", "tokens_relayed": relayed, "reservation": None, "reason": reason})
        )
        if relayed:
            delivered[generation_id] = relayed
    with connection.cursor() as cursor:
        params = {"ids": generation_ids, "settlement": settlement, "now": now}
        cursor.execute(sql.cancel_generations(), params)
        cancelled = {generation_id for (generation_id,) in cursor.fetchall()}
    charged = reason != Ending.UNAVAILABLE
    _pay_delivered({g: tokens for g, tokens in delivered.items() if g in cancelled}, now, charged=charged)


def _pay_delivered(delivered: dict[UUID, int], now: datetime, *, charged: bool) -> None:
    """Settle cancelled generations for the tokens they delivered, in the caller's transaction;
    their requesters pay only if `charged`."""
    if not delivered:
        return
    paid = Generation.objects.filter(pk__in=delivered).select_related("worker__account", "request")
    for generation in paid.defer("request__prompt", "request__messages", "text"):
        settled = settle(
            generation, tokens=delivered[generation.pk], result=Generation.Result.OK, now=now, charged=charged
        )
        # The rows in the submit's order (generation, request, worker, hold, then wallets): no cycle.
        Generation.objects.filter(pk=generation.pk).update(reward=settled.earned)
        TextRequest.objects.filter(pk=generation.request_id).update(
            kudos_spent=F("kudos_spent") + settled.cost
        )
        holds.draw(request_id=generation.request_id, charged=settled.cost)
        Worker.objects.filter(pk=generation.worker_id).update(
            kudos_rewards=F("kudos_rewards") + settled.earned
        )
        ledger.post_params(settled.params)


def _end_streams(failures: list[tuple[UUID, Ending]], dead_generations: list[UUID]) -> None:
    """Tell waiting requesters their requests ended, and kill the generations' leases."""
    leases.kill(dead_generations)
    relay.publish_many([(request_id, relay.FAILED, "", {"code": code}) for request_id, code in failures])


class AbortedJob(NamedTuple):
    """A generation taken from its worker (its lease lapsed, or the worker gave it back)."""

    request_id: UUID
    generation_id: UUID


class Restart(NamedTuple):
    """A request after its aborted jobs went back to it: still active, or faulted with its ending."""

    request_id: UUID
    state: str
    relayed: bool  # a requester follows it (`TextRequest.relayed`)
    ending: str
    # What a worker needs to take its jobs back in the queue (`queued`): for waiting pops.
    requested_models: list[str]
    kind: str
    max_length: int
    max_context_length: int
    queued: int
    n: int  # the jobs it asked for


def restart_requests(
    *, counts: Counter[UUID], after_commit: Ending, now: datetime | None = None
) -> list[Restart]:
    """Give `counts` aborted jobs back to each request, or fault a request past its restarts.

    A request whose stream was committed to a requester faults at once, ending `after_commit`
    (its worker stopped delivering, or gave the job back): there is no fallback after commit.
    A faulted /v1 request of several jobs has its other running jobs cancelled (`_cancel_siblings`)."""
    ids, added = zip(*counts.items(), strict=True)
    params = {
        "ids": list(ids),
        "added": list(added),
        "max": settings.TEXT_REQUEST_MAX_RESTARTS,
        "after_commit": after_commit.value,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql.restart_requests(), params)
        restarts = [Restart(*row) for row in cursor.fetchall()]
    _cancel_siblings(
        [r for r in restarts if r.state == TextRequest.State.FAULTED and r.relayed and r.n > 1],
        now or clock.now(),
    )
    return restarts


def _cancel_siblings(faulted: list[Restart], now: datetime) -> None:
    """Cancel the jobs still running of relayed requests of several jobs (a /v1 request's `n`)
    that just faulted: their requester was told the request failed, so nobody will receive
    their output (a horde request's, read by polling, are left to finish). Their workers are
    told GenerationCancelled at their next post, which does not count against them. A job
    whose submit holds it now is left to it (skip locked), as `cancel_request` leaves one; a
    statement more only when such a request faults."""
    if not faulted:
        return
    by_request = {restart.request_id: restart for restart in faulted}
    running = list(
        Generation.objects.filter(request_id__in=by_request, state=Generation.State.PROCESSING)
        .select_for_update(no_key=True, skip_locked=True)
        .order_by("pk")
        .values_list("pk", "request_id")
    )
    for ending in {by_request[request_id].ending for _, request_id in running}:
        ended = {g: by_request[r].max_length for g, r in running if by_request[r].ending == ending}
        _cancel_generations(ended, Ending(ending), now)
    if running:
        transaction.on_commit(lambda: leases.kill([g for g, _ in running]), robust=True)


def relay_restarts(*, restarts: list[Restart], aborted: list[AbortedJob]) -> None:
    """Kill the aborted generations' leases and tell each waiting chat requester what happened:
    its job restarts, or its request faulted."""
    leases.kill([job.generation_id for job in aborted])
    waits.publish(
        [
            waits.Offer(
                models=tuple(restart.requested_models),
                chat=restart.kind == TextRequest.Kind.CHAT,
                max_length=restart.max_length,
                max_context_length=restart.max_context_length,
                jobs=restart.queued,
            )
            for restart in restarts
            if restart.state == TextRequest.State.ACTIVE and restart.queued
        ]
    )
    chats = {restart.request_id: restart for restart in restarts if restart.relayed}
    events = []
    for job in aborted:
        restart = chats.get(job.request_id)
        if restart is None:
            continue
        events.append((job.request_id, relay.RESTARTED, str(job.generation_id), {}))
        if restart.state == TextRequest.State.FAULTED:
            events.append((job.request_id, relay.FAILED, str(job.generation_id), {"code": restart.ending}))
    relay.publish_many(events)
