"""Cancelling a chat request whose requester went away or ran out of time.

The cancellation is made at once when the database takes it. While the database is away it
waits: this process retries every DATABASE_WATCH_SECONDS, and Redis records it for the stale
pass, which makes it should this process not live to.
"""

import asyncio
import logging
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django.db import DatabaseError

from hordeops import asyncdb, dbwait
from jobs import services
from jobs.models import Ending

logger = logging.getLogger(__name__)

# This process's cancellations that wait for the database, and the task that makes them.
_waiting: dict[UUID, Ending] = {}
_retrying: asyncio.Task | None = None


async def cancel(request_id: UUID, ending: Ending, *, database_lost: bool = False) -> None:
    """Cancel the request, or defer it when the database cannot take it: at once when the
    relay hub found the database gone, so that a crowd of streams does not wait on the pool."""
    if database_lost or not await asyncio.shield(asyncdb.run(cancel_now, request_id, ending)):
        _defer(request_id, ending)


def cancel_now(request_id: UUID, ending: Ending) -> bool:
    """Nothing restarts the cancelled request. False when the database could not take the
    cancellation now: Redis then records it for the stale pass."""
    try:
        with dbwait.bounded(None):  # past the deadline too: the cancellation must be made
            services.cancel_request(request_id=request_id, reason=ending)
    except DatabaseError:
        logger.warning("cancellation deferred: the database is unavailable")
        try:
            services.defer_cancellations(reasons={request_id: ending})
        except redis.exceptions.RedisError:
            logger.error("a deferred cancellation is held by this process only: Redis is unavailable")
        return False
    except Exception:
        logger.exception("could not cancel an abandoned chat request")
    return True


def _defer(request_id: UUID, ending: Ending) -> None:
    global _retrying
    _waiting[request_id] = ending
    loop = asyncio.get_running_loop()
    if _retrying is None or _retrying.done() or _retrying.get_loop() is not loop:
        _retrying = loop.create_task(_retry())


async def _retry() -> None:
    recorded: set[UUID] = set()
    while _waiting:
        await asyncio.sleep(settings.DATABASE_WATCH_SECONDS)
        pending = dict(_waiting)
        fresh = {key: value for key, value in pending.items() if key not in recorded}
        try:
            await asyncio.to_thread(services.defer_cancellations, reasons=fresh)
            recorded.update(fresh)
        except redis.exceptions.RedisError:
            pass  # this process still holds them
        try:
            made = await asyncdb.run(services.cancel_deferred, pending=pending)
        except DatabaseError:
            continue  # still away
        for request_id in made:
            _waiting.pop(request_id, None)
