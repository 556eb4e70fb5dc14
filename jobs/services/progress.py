"""A chat worker's progress post: relay its delta and renew its lease (jobs.leases decides)."""

import logging
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection

from hordeops import clock, errors
from jobs import leases, sql
from jobs.models import Generation, TextRequest
from jobs.services.endings import cancel_request
from jobs.services.posts import _posted_generation, _refusal, _refuse_past_deadline, _too_long

logger = logging.getLogger(__name__)

LOST_MESSAGE = (
    "This generation was cancelled: the horde lost its stream (Redis restarted) and nobody "
    "waits for its output any more. It does not count against the worker."
)


@dataclass(frozen=True)
class ProgressResult:
    lease: leases.Outcome  # one of leases.ANSWERED
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
    worker told, so that no generation is ever aborted with a live stream lease. A lease that
    Redis lost (a restart) is rebuilt from the row while its requester still follows, and
    otherwise the request is cancelled and the worker told GenerationCancelled.
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
    if outcome == leases.Outcome.DEAD:
        raise _refusal(generation.pk)
    if outcome == leases.Outcome.LOST:
        # Redis lost the lease and its requester is gone (told of the failure, or away):
        # nobody would read the output, so the job ends here rather than running for no one.
        cancel_request(request_id=generation.request_id, reason=errors.ServiceUnavailable.code, now=now)
        raise errors.GenerationCancelled(LOST_MESSAGE)
    if outcome == leases.Outcome.TOO_LONG:
        raise _too_long(generation.request)
    if outcome == leases.Outcome.GAP:
        raise errors.ProgressOutOfOrder(
            f"Progress seq {seq} skips ahead: the last accepted seq is {renewal.last_seq}.",
            last_seq=renewal.last_seq,
        )
    if outcome == leases.Outcome.GRANTED:
        job_ttl = renewal.job_ttl(popped_at=generation.popped_at, cap_seconds=generation.cap_seconds)
        with connection.cursor() as cursor:
            cursor.execute(sql.renew(), [job_ttl, generation.pk])
            written = cursor.rowcount
        if not written:
            leases.kill([generation.pk])
            raise _refusal(generation.pk)
    return ProgressResult(lease=renewal.answered(now), expires_at=renewal.expires_at, ttl=renewal.ttl(now))
