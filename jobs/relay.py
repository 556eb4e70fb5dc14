"""The relay from workers to requesters: one Redis stream per request.

Progress deltas are appended by the lease script (`jobs.leases`); the submit, the stale pass
and cancellations append the events that end a generation or a request. Any web process can
serve a requester's stream, whichever process the worker posted to: nothing is held in one
process's memory.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

import redis.asyncio
from django.conf import settings
from django_redis import get_redis_connection

from jobs.leases import KEY_GRACE_SECONDS, relay_key

# Event types besides "delta" (written by the lease script).
DONE = "done"  # the generation was submitted: text is the whole reply
RESTARTED = "restarted"  # the generation was aborted or given back and its job requeued
FAILED = "failed"  # the request ended without a reply: code says why
BLOCK_MS = 5000


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    generation: str
    fields: dict[str, str]

    @property
    def text(self) -> str:
        return self.fields.get("text", "")


def publish(request_id: UUID, type_: str, generation_id: UUID | str = "", **fields: str | int) -> None:
    """Append one event to the request's relay stream."""
    publish_many([(request_id, type_, str(generation_id), {k: str(v) for k, v in fields.items()})])


def publish_many(events: list[tuple[UUID, str, str, dict[str, str]]]) -> None:
    """Append several events in one round trip: (request id, type, generation id, fields)."""
    if not events:
        return
    client = get_redis_connection("default")
    pipe = client.pipeline(transaction=False)
    for request_id, type_, generation_id, fields in events:
        key = relay_key(request_id)
        pipe.xadd(key, {"type": type_, "generation": generation_id, **fields})
        pipe.expire(key, settings.TEXT_REQUEST_LIFETIME_SECONDS + KEY_GRACE_SECONDS)
    pipe.execute()


async def events(request_id: UUID) -> AsyncIterator[Event]:
    """Yield the request's relay events from the beginning, waiting on Redis for new ones.

    The caller stops iterating when it has what it needs; a cancelled task (a client that
    went away) closes the connection on the way out.
    """
    client = redis.asyncio.from_url(settings.REDIS_URL)
    key = relay_key(request_id)
    last_id = "0-0"
    try:
        while True:
            answer = await client.xread({key: last_id}, block=BLOCK_MS, count=100)
            for _stream, entries in answer or ():
                for entry_id, raw in entries:
                    last_id = entry_id.decode()
                    fields = {k.decode(): v.decode() for k, v in raw.items()}
                    yield Event(
                        id=last_id,
                        type=fields.pop("type"),
                        generation=fields.pop("generation", ""),
                        fields=fields,
                    )
    finally:
        await client.aclose()
