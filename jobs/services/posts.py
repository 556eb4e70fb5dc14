"""What a worker's progress post and submit share: whose generation it is, and why it is refused."""

import logging
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from hordeops import errors
from hordeops.rows import fetch_instances
from jobs import sql
from jobs.models import Ending, Generation, TextRequest
from jobs.services.endings import cancel_request
from workers.models import Account, hash_api_key
from workers.services import refuse_suspended, required_api_key

logger = logging.getLogger(__name__)


def posted_generation(*, api_key: str | None, generation_id: UUID) -> Generation:
    """The generation a worker posts to, once the key is known and owns its worker (loaded as
    the worker's account, with its trust).

    The key is checked in the generation's own statement: a bad key is refused before a bad
    id, as when authenticating came first."""
    post = worker_post(generation_id=generation_id, api_key=required_api_key(api_key))
    if post is None:
        raise errors.InvalidAPIKey()
    generation = post.generation
    if generation is None:
        raise errors.InvalidJobID()
    if generation.worker.account_id != post.caller.id:
        raise errors.WrongCredentials()
    generation.worker.account = post.caller
    return generation


class WorkerPost(NamedTuple):
    caller: Account
    generation: Generation | None


def worker_post(*, generation_id: UUID, api_key: str) -> WorkerPost | None:
    """Who posts (the account of `api_key`, its id loaded) and the generation they post
    progress or a result to, with its worker (the account) and its request (kind, state,
    max_length, deadline): one statement (`sql.worker_post`), no ORM compiling, on the two
    hottest routes after the pop. None if no account has the key; the generation is None if
    there is no such generation. Other fields load on access."""
    found = fetch_instances(
        sql.worker_post(),
        {"id": generation_id, "api_key_hash": hash_api_key(api_key)},
        *sql.WORKER_POST_PARTS,
    )
    if found is None:
        return None
    caller, generation, worker, request = found
    refuse_suspended(caller)
    if generation is not None:
        generation.worker, generation.request = worker, request
    return WorkerPost(caller=caller, generation=generation)


def refusal(*, generation_id: UUID) -> errors.DomainError:
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


def output_too_long(*, text_request: TextRequest) -> errors.OutputTooLong:
    return errors.OutputTooLong(
        f"This job asked for at most {text_request.max_length} tokens, so its output may be at most "
        f"{text_request.output_limit_bytes} bytes of UTF-8 in all "
        f"({TextRequest.OUTPUT_BYTES_PER_TOKEN} a token plus {TextRequest.OUTPUT_ALLOWANCE_BYTES}).",
        limit_bytes=text_request.output_limit_bytes,
    )


def refuse_past_deadline(*, text_request: TextRequest, now: datetime) -> None:
    """Past the requester's deadline the job is cancelled, whatever the pass has done yet."""
    if text_request.deadline_at and now >= text_request.deadline_at:
        cancel_request(request_id=text_request.pk, reason=Ending.DEADLINE, now=now)
        raise errors.GenerationCancelled("The requester's generation deadline ran out.")


REQUESTER_LOST = (
    "This generation was cancelled: the horde lost the connection of the requester waiting for "
    "it (the web process that served it stopped). It does not count against the worker."
)


def requester_lost(*, text_request: TextRequest, generation_id: UUID, now: datetime) -> errors.DomainError:
    """Cancel a request whose follower is gone (`jobs.relay`): nobody can be sent its output,
    nor charged for it. The error that tells its worker to stop; a request that had already
    ended otherwise is refused as its generation's state says."""
    ended = cancel_request(request_id=text_request.pk, reason=Ending.UNAVAILABLE, now=now)
    if ended.ending == Ending.UNAVAILABLE:
        return errors.GenerationCancelled(REQUESTER_LOST)
    return refusal(generation_id=generation_id)
