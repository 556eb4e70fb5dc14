"""The next turn of a conversation goes to the worker that served the last one: its engine
still holds the history's prefix in its cache, so it need not read the whole history again.

A request continues a conversation when its prompt begins with an earlier request's prompt
followed by that request's reply (a `/v1` chat's prompt is its messages rendered, so its
messages continue the earlier ones; KoboldAI Lite and SillyTavern resend the whole story as a
text prompt). When a generation is accepted, the worker is remembered for what a follow-up
would begin with, for WARM_WORKER_MEMORY_SECONDS. A request that continues one is offered to
that worker alone for WARM_WORKER_SECONDS (`TextRequest.preferred_worker`, the pop's offer rule
in `jobs.eligibility`), and only if the worker is online, has a free thread and would be offered
it by the speed gate; after that, or else, to anyone, as any request.

Nothing of the text is kept: a memory is the length of what a follow-up begins with and a
keyed digest of it. The key is the account's (with the horde's secret), and each account's
memories are its own: a requester cannot steer another account's requests to a worker.
"""

import hashlib
import json
import logging
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django_redis import get_redis_connection

from jobs.models import TextRequest

logger = logging.getLogger(__name__)

# The conversations remembered per account, newest first.
MEMORIES_PER_ACCOUNT = 16
# How a chat turn ends in its rendered prompt (`jobs.services.requests.render_chat_prompt`).
CHAT_TURN_END = "<|im_end|>\n"


def _key(account_id: int) -> str:
    return f"hordeops:warm:{account_id}"


def turn_key(account_id: int) -> bytes:
    """The account's key of its memories' digests: the horde's secret, the account's id."""
    return hashlib.sha256(f"warm-worker:{settings.SECRET_KEY}:{account_id}".encode()).digest()


def _digest(account_id: int, text: str) -> str:
    # As the submit's statement computes it in PostgreSQL (`jobs.sql.posts._TURN`).
    return hashlib.sha256(turn_key(account_id) + text.encode()).hexdigest()


def continued(request: TextRequest, reply: str) -> str:
    """What the request's follow-up begins with: its prompt, its reply and, for a chat, the end
    of the reply's turn (the submit reads its length and digest in SQL, `jobs.sql.posts._TURN`)."""
    return request.prompt + reply + (CHAT_TURN_END if request.kind == TextRequest.Kind.CHAT else "")


def remember(*, account_id: int, length: int, digest: str, worker_id: UUID) -> None:
    """Remember that `worker_id` served the conversation a follow-up begins with, known by its
    `length` (in characters) and `digest` (`_digest`)."""
    memory = json.dumps({"n": length, "d": digest, "w": str(worker_id)})
    try:
        with _redis().pipeline(transaction=False) as pipe:
            pipe.lpush(_key(account_id), memory)
            pipe.ltrim(_key(account_id), 0, MEMORIES_PER_ACCOUNT - 1)
            pipe.expire(_key(account_id), settings.WARM_WORKER_MEMORY_SECONDS)
            pipe.execute()
    except redis.exceptions.RedisError:
        logger.warning("could not remember the worker of a conversation", exc_info=True)


def warm_worker(*, account_id: int, prompt: str) -> UUID | None:
    """The worker that served the longest conversation of the account's that `prompt`
    continues, within WARM_WORKER_MEMORY_SECONDS; None when it continues none."""
    if settings.WARM_WORKER_SECONDS <= 0:
        return None
    try:
        memories = _redis().lrange(_key(account_id), 0, MEMORIES_PER_ACCOUNT - 1)
    except redis.exceptions.RedisError:
        return None  # no preference, as for any request: nothing waits for Redis
    best: tuple[int, str] | None = None
    for raw in memories:
        memory = json.loads(raw)
        length = memory["n"]
        # A strictly longer prompt: a follow-up adds a turn to what it continues.
        if length < len(prompt) and (best is None or length > best[0]):
            if _digest(account_id, prompt[:length]) == memory["d"]:
                best = (length, memory["w"])
    return UUID(best[1]) if best else None


def _redis():
    return get_redis_connection("default")
