"""Pops that wait for work: a worker's empty pop held on the event loop until a job it can take
is queued, then popped again.

Queueing a request, or giving its jobs back to the queue (a restart), publishes after the
commit what a worker needs to take them (their models, kind and lengths: `Offer`) on one
Redis channel (`channel()`, one per Redis database). Each web process reads that channel on
one pub/sub connection (`_Hub`, one per event loop, as `jobs.relay_hub`'s) and wakes, oldest
first, as many of its own waiting pops as could take the request, up to its jobs plus
WAKE_MARGIN, and no more of one worker's slots than its jobs: not every waiting worker. A
worker's slots may wait in every web process; a woken slot pops only if it takes a ticket for
the message in Redis (`_Hub.ticket`), so that across the processes no more of them pop than
the request has jobs. A woken
pop pops again through `pop_generation`, so that the fair order and the speed gate decide as
for any pop; finding nothing (another worker was first), it waits on. A waiting pop holds no
thread and no database connection: its pops run on the threads that serve the worker routes
(`hordeops.asyncdb.run_on_view_threads`), not behind the chat routes' steps, so that a burst
of chats being queued does not hold back the pops that take them.

At the end of its wait a pop answers its first, empty answer (its `skipped` and `messages` as
they were when it arrived): the worker pops again at once, and that pop finds any job that
became offerable by time alone (a fallback tier opening), which no message announces. A pop
more at the end would double a waiting fleet's statements for nothing. Redis lost: every
waiting pop answers at once, and a pop that cannot join the channel answers at once; the
worker then polls as a plain pop does. A client that leaves ends its wait and is not popped
for (checked before each pop); a job popped in the moment the client leaves is restarted by
the stale pass when its lease lapses.
"""

import asyncio
import contextlib
import json
import logging
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any, TypeVar

import redis.exceptions
from django.conf import settings
from django.db import transaction
from django_redis import get_redis_connection

from hordeops import asyncdb, clock
from jobs.models import TextRequest
from jobs.relay_hub import _async_redis
from workers.declaration import CAPABILITIES

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The most a pop may wait (the pop body's `wait_seconds`): far inside WORKER_ONLINE_SECONDS, so
# that a worker checked in by each pop stays online while it waits.
MAX_WAIT_SECONDS = 30
# Pub/sub channels are server-wide, not per database: the database is in the name, so that two
# stacks on one Redis server (each its own database) never wake each other's pops.
CHANNEL_PREFIX = "hordeops:pop-wake"
HUB_CLIENT_NAME = "hordeops-pop-waits"
# Waiting pops woken per queued job beyond one each: a woken worker may lose to another
# process's, or be passed over by the speed gate.
WAKE_MARGIN = 1
# Messages remembered, so that a pop joining after its first pop began still sees a request
# queued meanwhile; and how long the connection stays open with no pop waiting.
RECENT_SECONDS = 10.0
LINGER_SECONDS = 30.0


@dataclass(frozen=True)
class Offer:
    """What taking a queued request needs (`jobs.eligibility`'s plain filters that depend on the
    worker's declaration alone), and how many jobs it has. Empty `models`: any model."""

    models: tuple[str, ...]
    chat: bool
    max_length: int
    max_context_length: int
    jobs: int
    # A conversation's next turn (`jobs.affinity`): the warm worker's alone for `open_after`
    # seconds, then anyone's; "" for any other request.
    worker: str = ""
    open_after: float = 0.0
    # The capabilities its worker must declare (`workers.declaration.CAPABILITIES`).
    needs: tuple[str, ...] = ()
    validated: bool = False  # only for a worker of a validated bridge (`validated_backends`)
    # This message's own id: the tickets one worker's slots take for it (`_Hub.ticket`).
    wake_id: str = ""

    @classmethod
    def of(cls, request: TextRequest) -> "Offer":
        preferred = request.preferred_worker is not None and request.preferred_until is not None
        open_after = (request.preferred_until - clock.now()).total_seconds() if preferred else 0.0
        preferred = preferred and open_after > 0  # a window already over: anyone's now
        return cls(
            models=tuple(request.requested_models),
            chat=request.kind == TextRequest.Kind.CHAT,
            max_length=request.max_length,
            max_context_length=request.max_context_length,
            jobs=request.queued,
            worker=str(request.preferred_worker) if preferred else "",
            open_after=open_after if preferred else 0.0,
            needs=tuple(name for name in CAPABILITIES if getattr(request, f"needs_{name}")),
            validated=request.validated_backends,
        )


def channel() -> str:
    return f"{CHANNEL_PREFIX}:{settings.REDIS_DB}"


def publish_queued(request: TextRequest) -> None:
    """Announce `request` to waiting pops once its transaction commits (at once outside one)."""
    publish([Offer.of(request)])


def publish(offers: list[Offer]) -> None:
    """Announce jobs put in the queue (a request queued, or restarted) to waiting pops, once
    the transaction commits (at once outside one). A lost Redis refuses nothing: waiting pops
    find the jobs at their wait's end."""
    if not offers:
        return
    messages = [
        json.dumps(
            [
                list(o.models),
                o.chat,
                o.max_length,
                o.max_context_length,
                o.jobs,
                o.worker,
                o.open_after,
                list(o.needs),
                o.validated,
                o.wake_id or uuid.uuid4().hex,
            ]
        )
        for o in offers
    ]

    def send() -> None:
        try:
            pipe = get_redis_connection("default").pipeline(transaction=False)
            for message in messages:
                pipe.publish(channel(), message)
            pipe.execute()
        except redis.exceptions.RedisError as err:
            logger.warning("waiting pops not told of queued jobs: %s", type(err).__name__)

    transaction.on_commit(send)


def _parsed(data: bytes) -> Offer:
    models, chat, max_length, max_context_length, jobs, worker, open_after, *rest = json.loads(data)
    return Offer(
        tuple(models),
        bool(chat),
        int(max_length),
        int(max_context_length),
        int(jobs),
        str(worker),
        float(open_after),
        # A process not yet upgraded sends none of these.
        tuple(str(name) for name in rest[0]) if rest else (),
        bool(rest[1]) if len(rest) > 1 else False,
        str(rest[2]) if len(rest) > 2 else "",
    )


_order = count()


@dataclass(eq=False)
class Waiter:
    """One waiting pop, as its worker declared itself."""

    models: frozenset[str]
    chat: bool
    max_length: int
    max_context_length: int
    worker_id: str = ""  # the waiting worker's: a conversation's next turn may be its alone
    capabilities: frozenset[str] = frozenset()  # what it declares (`CAPABILITIES`)
    validated: bool = False  # its bridge is one the horde validates (`kudos.rates.is_validated`)
    order: int = field(default_factory=lambda: next(_order))
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    woken_by: Offer | None = None  # the message that woke it, if one did
    popping: bool = False  # between its wake and the end of the pop it made
    ended: bool = False  # its hub failed or stops: pop once more and answer

    def can_take(self, offer: Offer) -> bool:
        return (
            (not offer.models or not self.models.isdisjoint(offer.models))
            and (self.chat or not offer.chat)
            and offer.max_length <= self.max_length
            and offer.max_context_length <= self.max_context_length
            and (not offer.worker or offer.worker == self.worker_id)
            and self.capabilities.issuperset(offer.needs)
            and (self.validated or not offer.validated)
        )


class _Hub:
    """The wake-ups of every pop waiting on this event loop, over one pub/sub connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._client = _async_redis(client_name=HUB_CLIENT_NAME)
        self._pubsub = self._client.pubsub()
        self._waiters: dict[int, Waiter] = {}  # in arrival order
        self._recent: deque[tuple[float, Offer]] = deque()
        self._listener: asyncio.Task | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._ready: asyncio.Future[None] = loop.create_future()  # the subscription holds, or failed
        self._ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.subscribed_at: float | None = None  # time.monotonic() of Redis's confirmation
        self.closed = False
        self.woken = 0  # waiters woken by messages, for tests and logs

    async def join(self, waiter: Waiter, *, since: float) -> None:
        """Add `waiter`; woken at once if a request it could take may have been queued since
        `since` (its first pop's start) without it seeing it."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._waiters[waiter.order] = waiter
        try:
            if self._listener is None:
                self._listener = self._loop.create_task(self._listen())
            await asyncio.shield(self._ready)
        except BaseException:
            self.leave(waiter)
            raise
        if self.subscribed_at > since or self._missed(waiter, since):
            waiter.woken.set()

    def _missed(self, waiter: Waiter, since: float) -> bool:
        for received, offer in reversed(self._recent):
            if received <= since:
                return False  # published before the first pop began, which saw it
            if waiter.can_take(offer):
                return True
        return False

    def leave(self, waiter: Waiter) -> None:
        self._waiters.pop(waiter.order, None)
        if not self._waiters and not self.closed and self._linger is None:
            self._linger = self._loop.call_later(LINGER_SECONDS, self._close_idle)

    async def _listen(self) -> None:
        try:
            await self._pubsub.subscribe(channel())
            while True:
                message = await self._pubsub.get_message(timeout=None)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self.subscribed_at = time.monotonic()
                    if not self._ready.done():
                        self._ready.set_result(None)
                elif message["type"] == "message":
                    try:
                        offer = _parsed(message["data"])
                    except (ValueError, TypeError):
                        logger.warning("a message on %s that is not an offer: ignored", channel())
                        continue
                    self._wake(offer)
        except (redis.exceptions.RedisError, OSError) as err:
            logger.warning("pop waits' channel lost (%s): waiting pops answer now", type(err).__name__)
            self.fail()
        except asyncio.CancelledError:
            self.fail()
            raise

    def _wake(self, offer: Offer) -> None:
        if offer.worker and offer.open_after > 0:
            # The warm worker's alone for now (`can_take`), anyone's once its window ends.
            opened = replace(offer, worker="", open_after=0.0)
            self._loop.call_later(offer.open_after, lambda: self.closed or self._wake(opened))
        now = time.monotonic()
        self._recent.append((now, offer))
        while self._recent[0][0] < now - RECENT_SECONDS:
            self._recent.popleft()
        bound = offer.jobs + WAKE_MARGIN
        # A worker's idle slots are alike: more of them than it could take jobs would pop for
        # nothing, beside the one that takes the job. A slot in the middle of a pop is woken to
        # pop again (its pop may not see this job) but is not one of them, nor counted in the
        # bound: it may be taking another job, and in a burst every slot may be popping.
        per_worker: dict[str, int] = {}
        for waiter in self._waiters.values():
            idle = not waiter.popping
            if idle and (
                bound == 0 or (waiter.worker_id and per_worker.get(waiter.worker_id, 0) >= offer.jobs)
            ):
                continue
            if not waiter.woken.is_set() and waiter.can_take(offer):
                waiter.woken_by = offer
                waiter.woken.set()
                self.woken += 1
                if idle:
                    bound -= 1
                    per_worker[waiter.worker_id] = per_worker.get(waiter.worker_id, 0) + 1

    async def ticket(self, waiter: Waiter, offer: Offer) -> bool:
        """Whether `waiter`, woken by `offer`, pops for it: its worker's slots may wait in every
        web process, and each process wakes one, but no more of them pop than the offer has
        jobs (a count per message and worker in Redis). Redis lost: it pops."""
        if not offer.wake_id or not waiter.worker_id:
            return True
        key = f"{channel()}:{offer.wake_id}:{waiter.worker_id}"
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.incr(key)
                pipe.expire(key, int(RECENT_SECONDS))
                taken, _ = await pipe.execute()
        except (redis.exceptions.RedisError, OSError):
            return True
        return taken <= offer.jobs

    def fail(self) -> None:
        """Every waiting pop answers now; later pops use a new hub."""
        if self.closed:
            return
        self._forget()
        if not self._ready.done():
            self._ready.set_exception(redis.exceptions.ConnectionError("the pop waits' channel closed"))
        for waiter in self._waiters.values():
            waiter.ended = True
            waiter.woken.set()
        if self._listener is not None and self._listener is not asyncio.current_task():
            self._listener.cancel()
        self._loop.create_task(self._disconnect())

    def _close_idle(self) -> None:
        self._linger = None
        if not self._waiters:
            self.fail()

    def _forget(self) -> None:
        self.closed = True
        if _hubs.get(self._loop) is self:
            del _hubs[self._loop]

    async def _disconnect(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            await self._pubsub.aclose()
            await self._client.aclose()


_hubs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub]" = weakref.WeakKeyDictionary()


def hub() -> _Hub:
    """This event loop's hub, made on first use."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = _Hub(loop)
    return found


async def stop_waiting() -> None:
    """The web process is stopping: its waiting pops answer now."""
    found = _hubs.get(asyncio.get_running_loop())
    if found is not None:
        found.fail()


GONE = object()  # the client left while its pop waited


async def wait_for_job(
    waiter: Waiter,
    *,
    since: float,
    ends: float,
    pop: Callable[[], tuple[bool, T]],
    client_gone: asyncio.Future,
) -> T | None | object:
    """Wait until `waiter` is woken, then `pop()` (on a sync view thread): its answer once it
    holds a job, else wait on, until `ends` (time.monotonic()). None: answer the first pop
    (the wait ended, its hub failed, or it could not start). GONE: the client left
    (`client_gone` done) and nothing was popped for it. `since`: when the first pop began."""
    try:
        waits = hub()
        await waits.join(waiter, since=since)
    except redis.exceptions.RedisError as err:
        logger.warning("a pop cannot wait (%s): answered now", type(err).__name__)
        return None
    try:
        while True:
            left = ends - time.monotonic()
            if left > 0 and not waiter.woken.is_set():
                woken = asyncio.ensure_future(waiter.woken.wait())
                try:
                    await asyncio.wait(
                        {woken, client_gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    woken.cancel()
            if client_gone.done():
                return GONE
            if waiter.ended or not waiter.woken.is_set():
                return None  # the wait's end, or its hub's: the first pop's answer stands
            last = time.monotonic() >= ends
            # Cleared before the pop: a job queued while it runs, which it may not see, wakes it again.
            waiter.woken.clear()
            offer, waiter.woken_by = waiter.woken_by, None
            waiter.popping = True
            try:
                if offer is not None and not last and not await waits.ticket(waiter, offer):
                    continue  # another process's slot of this worker pops for it
                taken, answer = await asyncdb.run_on_view_threads(pop)
            finally:
                waiter.popping = False
            if taken or last:
                return answer
            if offer is not None and offer.jobs > 1:
                # Another slot's pop of the same request may have held its row, which the claim
                # skips: one pop more, that lock gone, so that a request's jobs are all taken.
                waiter.woken.set()
    finally:
        waits.leave(waiter)


async def client_left(receive: Callable[[], Any]) -> None:
    """Returns when the ASGI client disconnects (its body was read whole before)."""
    while (await receive())["type"] != "http.disconnect":
        pass
