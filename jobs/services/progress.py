"""A chat worker's progress post: relay its delta and renew its lease (jobs.leases decides)."""

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import DatabaseError

from hordeops import clock, errors
from jobs import leases, relay
from jobs.models import Ending, Generation
from jobs.protocols import agents
from jobs.services import posts
from jobs.services.endings import cancel_request
from jobs.services.requests import commit_stream

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
    tool_calls: list[dict] | None = None,
) -> ProgressResult:
    """Relay a chat worker's new output and renew its lease when the output is new.

    `tool_calls`: pieces of the reply's tool calls (`agents.call_pieces`), relayed with the
    delta as output is; they are judged whole at the submit.

    `leases.renew` decides and writes. A lease that Redis lost (a restart) is rebuilt from the
    row while its requester still follows, and otherwise the request is cancelled and the
    worker told GenerationCancelled; so is one whose requester's follower is gone.
    """
    now = now or clock.now()
    generation = posts.posted_generation(api_key=api_key, generation_id=generation_id)
    if generation.state != Generation.State.PROCESSING:
        raise posts.refusal(generation_id=generation.pk)
    if not generation.request.relayed:
        raise errors.BadRequest(
            "Progress posts are for chat jobs and streamed text completions; this text job keeps "
            "its flat lease."
        )
    posts.refuse_past_deadline(text_request=generation.request, now=now)
    calls = ""
    if tool_calls:
        try:
            calls = json.dumps(agents.call_pieces(tool_calls), separators=(",", ":"))
        except agents.BadReply as err:
            raise errors.BadRequest(str(err)) from None
    model = _commit(generation, useful=relay.useful(delta, calls))
    renewal = leases.renew(generation, seq=seq, delta=delta, tokens=tokens, now=now, calls=calls, model=model)
    if renewal.outcome not in leases.ANSWERED:
        raise _refused(generation, renewal, seq=seq, now=now)
    return ProgressResult(lease=renewal.outcome, expires_at=renewal.expires_at, ttl=renewal.ttl(now))


def _commit(generation: Generation, *, useful: bool) -> str:
    """Commit a streaming requester's stream to `generation` at its first useful output, before
    that output is relayed: the model it is served by, which the relayed delta carries so that
    the requester's follower commits nothing itself (`jobs.follower`); "" when there is nothing
    to commit here. Its database failing leaves the commitment to the follower, as before."""
    if not (useful and generation.request.stream and not generation.streamed):
        return ""
    try:
        model = commit_stream(request_id=generation.request_id, generation_id=generation.pk)
    except DatabaseError:
        logger.warning("a stream's commitment failed at its progress post; its follower commits it")
        return ""
    if model is None:  # ended meanwhile: the lease script refuses the post, or the follower skips it
        return ""
    generation.streamed = True
    return model


def _refused(
    generation: Generation, renewal: leases.Renewal, *, seq: int, now: datetime
) -> errors.DomainError:
    """The error that answers a post the lease script refused."""
    if renewal.outcome == leases.Outcome.LOST:
        # Redis lost the lease and its requester is gone (told of the failure, or away):
        # nobody would read the output, so the job ends here rather than running for no one.
        cancel_request(request_id=generation.request_id, reason=Ending.UNAVAILABLE, now=now)
        return errors.GenerationCancelled(LOST_MESSAGE)
    if renewal.outcome == leases.Outcome.GONE:
        return posts.requester_lost(text_request=generation.request, generation_id=generation.pk, now=now)
    if renewal.outcome == leases.Outcome.TOO_LONG:
        return posts.output_too_long(text_request=generation.request)
    if renewal.outcome == leases.Outcome.GAP:
        return errors.ProgressOutOfOrder(
            f"Progress seq {seq} skips ahead: the last accepted seq is {renewal.last_seq}.",
            last_seq=renewal.last_seq,
        )
    return posts.refusal(generation_id=generation.pk)  # DEAD: aborted, cancelled or submitted
