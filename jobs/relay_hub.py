"""Following relay streams (written by `jobs.relay`) in a web process: `events` yields one
request's, from its start, then live.

A web process follows all its open requests through one pub/sub connection (`_Hub`), not a
connection per stream: a follower subscribes, waits until Redis confirms the subscription,
reads the backlog from the stream, then takes the live events, skipping any it has read.
While it follows any request, the hub also watches PostgreSQL (`hordeops.dbprobe`): with the
database gone no output can come, so every follower is failed as a lost Redis fails them.
A web process that stops (`stop_following`) fails its followers first, so that each stream
gets its error event.
"""

import asyncio
import json
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from uuid import UUID

import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions
from django.conf import settings

from hordeops import dbprobe, errors
from jobs.relay import KEY_GRACE_SECONDS, Event, followed_key, relay_key

logger = logging.getLogger(__name__)

# Connections one web process uses to read followers' backlogs (besides its pub/sub one).
BACKLOG_CONNECTIONS = 4
# Their names in Redis's CLIENT LIST.
HUB_CLIENT_NAME = "hordeops-relay-hub"
BACKLOG_CLIENT_NAME = "hordeops-relay-backlog"


def _order(entry_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = entry_id.partition("-")
    return int(milliseconds), int(sequence or 0)


# What one queued event holds in a web process besides its published bytes (measured: 0.9 KB
# for a one-byte delta), so that many small deltas count against STREAM_QUEUE_MAX_BYTES too.
EVENT_OVERHEAD_BYTES = 1024


class _Follower:
    """One requester's place in the hub: the live events of its channel, in order.

    The events its requester has not taken yet are bounded by STREAM_QUEUE_MAX_BYTES: past it
    they are dropped and the follower ends with StreamStalled, as a reader that far behind
    (or not reading at all) would only grow the web process's memory.
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        # (counted bytes, event); an error ends the follower: Redis's, DatabaseLost when the
        # database went, StreamStalled past the bound.
        self.queue: asyncio.Queue[tuple[int, Event] | Exception] = asyncio.Queue()
        self.queued_bytes = 0
        self.max_bytes = settings.STREAM_QUEUE_MAX_BYTES
        self.stalled = False
        self.on_stall: Callable[[], None] | None = None  # told once the bound is passed

    def deliver(self, event: Event, size: int) -> None:
        if self.stalled:
            return
        size += EVENT_OVERHEAD_BYTES
        self.queued_bytes += size
        if self.queued_bytes <= self.max_bytes:
            self.queue.put_nowait((size, event))
            return
        self.stalled = True
        logger.warning(
            "stream %s: %d bytes queued for a requester that does not read; the stream ends",
            self.channel,
            self.queued_bytes,
        )
        while not self.queue.empty():  # nothing of it will be sent: its memory goes now
            self.queue.get_nowait()
        self.queued_bytes = 0
        self.queue.put_nowait(errors.StreamStalled())
        if self.on_stall is not None:
            self.on_stall()

    def taken(self, size: int) -> None:
        self.queued_bytes -= size


class _BlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """The primary the sentinels name, with at most `max_connections` (a caller waits for one)."""


def _async_redis(*, client_name: str, max_connections: int | None = None) -> redis.asyncio.Redis:
    """An asyncio client of the horde's Redis: REDIS_URL's, or the primary REDIS_SENTINELS name
    (redis-py's own Sentinel support: a failover is followed at the next connection)."""
    if settings.REDIS_SENTINELS:
        sentinel = redis.asyncio.sentinel.Sentinel(
            settings.REDIS_SENTINELS, sentinel_kwargs={"socket_timeout": 2}
        )
        kwargs = {"client_name": client_name, "db": settings.REDIS_DB}
        if max_connections is not None:
            kwargs |= {"connection_pool_class": _BlockingSentinelPool, "max_connections": max_connections}
        return sentinel.master_for(settings.REDIS_SENTINEL_SERVICE, **kwargs)
    if max_connections is None:
        return redis.asyncio.Redis.from_url(settings.REDIS_URL, client_name=client_name)
    return redis.asyncio.Redis.from_pool(  # from_pool: aclose() closes the pool too
        redis.asyncio.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=max_connections, client_name=client_name
        )
    )


class _Hub:
    """The relay events of every request this event loop follows, over one pub/sub connection.

    It connects when the first follower comes and closes when the last one leaves. Redis
    confirms each SUBSCRIBE in the order it was sent, so a queue of waiting confirmations per
    channel tells each follower when its subscription holds. A lost connection fails every
    follower (its stream ends as a Redis outage does); the next follower starts a new hub.
    So does a database that stops answering its watch (`_watch_database`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._client = _async_redis(client_name=HUB_CLIENT_NAME)
        self._pubsub = self._client.pubsub()
        self._backlog = _async_redis(client_name=BACKLOG_CLIENT_NAME, max_connections=BACKLOG_CONNECTIONS)
        self._followers: dict[str, set[_Follower]] = {}
        # Channels with a SUBSCRIBE sent and no UNSUBSCRIBE since, each with the future that
        # Redis's confirmation of that SUBSCRIBE resolves.
        self._subscriptions: dict[str, asyncio.Future[None]] = {}
        # Every SUBSCRIBE not yet confirmed, oldest first, per channel.
        self._confirmations: dict[str, deque[asyncio.Future[None]]] = {}
        self._commands = asyncio.Lock()  # SUBSCRIBE and UNSUBSCRIBE go out in the order decided
        self._listener: asyncio.Task | None = None
        self._chores: set[asyncio.Task] = set()
        self.closed = False
        self._chore(self._watch_database())

    async def follow(self, channel: str) -> _Follower:
        """Join `channel`; returns once Redis confirmed the subscription, so nothing is missed."""
        follower = _Follower(channel)
        self._followers.setdefault(channel, set()).add(follower)
        try:
            confirmed = self._subscriptions.get(channel)
            if confirmed is None:
                confirmed = self._subscriptions[channel] = self._loop.create_future()
                # Consumed here, so that a failure nobody waits for any more is not reported.
                confirmed.add_done_callback(lambda done: done.cancelled() or done.exception())
                # The hub's own task sends it: a follower cancelled halfway through a command
                # would break the connection that every follower shares.
                self._chore(self._subscribe(channel, confirmed))
            await asyncio.shield(confirmed)
            return follower
        except BaseException:
            self.leave(follower)
            raise

    def leave(self, follower: _Follower) -> None:
        """Stop delivering to `follower`; synchronous, so that a cancelled task can call it."""
        followers = self._followers.get(follower.channel)
        if followers is None:
            return
        followers.discard(follower)
        if not followers:
            del self._followers[follower.channel]
            self._chore(self._unsubscribe(follower.channel))

    async def read(self, key: str, *, followed: str) -> list[Event]:
        """Every entry of the stream so far: a new follower's backlog. Its subscription holds,
        so the request is marked `followed` in the same round trip."""
        pipe = self._backlog.pipeline(transaction=False)
        pipe.set(followed, 1, ex=settings.TEXT_REQUEST_LIFETIME_SECONDS + KEY_GRACE_SECONDS)
        pipe.xrange(key)
        _, entries = await pipe.execute()
        return [
            Event.from_entry(entry_id.decode(), {k.decode(): v.decode() for k, v in raw.items()})
            for entry_id, raw in entries
        ]

    def _chore(self, coroutine) -> None:
        task = self._loop.create_task(coroutine)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _subscribe(self, channel: str, confirmed: asyncio.Future[None]) -> None:
        async with self._commands:
            if self.closed:
                if not confirmed.done():
                    confirmed.set_exception(redis.exceptions.ConnectionError("the relay hub closed"))
                return
            self._confirmations.setdefault(channel, deque()).append(confirmed)
            try:
                await self._pubsub.subscribe(channel)
            except redis.exceptions.RedisError as err:
                self._fail(err)
                return
            if self._listener is None:
                self._listener = self._loop.create_task(self._listen())

    async def _unsubscribe(self, channel: str) -> None:
        async with self._commands:
            if channel in self._followers or channel not in self._subscriptions or self.closed:
                return  # followed again meanwhile, or the hub is gone
            del self._subscriptions[channel]
            try:
                # Unmarked before unsubscribed: a follower that leaves is not one that died
                # (`followers_gone`), whose request would be cancelled as the horde's loss.
                await self._backlog.delete(followed_key(channel.rsplit(":", 1)[1]))
                await self._pubsub.unsubscribe(channel)
            except redis.exceptions.RedisError as err:
                self._fail(err)

    async def _listen(self) -> None:
        try:
            while True:
                message = await self._pubsub.get_message(timeout=None)
                if message is None:
                    continue
                kind, channel = message["type"], message["channel"].decode()
                if kind == "message":
                    entry_id, flat = json.loads(message["data"])
                    event = Event.from_entry(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                    size = len(message["data"])
                    for follower in self._followers.get(channel, ()):
                        follower.deliver(event, size)
                elif kind == "subscribe":
                    waiting = self._confirmations.get(channel)
                    if waiting:
                        confirmed = waiting.popleft()
                        if not waiting:
                            del self._confirmations[channel]
                        if not confirmed.done():
                            confirmed.set_result(None)
                elif kind == "unsubscribe" and message["data"] == 0 and not self._subscriptions:
                    await self._close()
                    return
        except redis.exceptions.RedisError as err:
            self._fail(err)
        except OSError as err:
            self._fail(redis.exceptions.ConnectionError(str(err)))
        except asyncio.CancelledError:
            self._fail(redis.exceptions.ConnectionError("the relay hub was stopped"))
            raise

    async def _watch_database(self) -> None:
        """Fail every follower once PostgreSQL cannot be reached; ends with the hub. While a
        standby answers (a failover under way), not before DATABASE_FAILOVER_SECONDS: the
        followers' state is in Redis, and their workers' posts go through once a new primary
        is there."""
        probe = dbprobe.DatabaseProbe(timeout=settings.DATABASE_WATCH_SECONDS * 2)
        primary_lost_at: float | None = None
        try:
            while not self.closed:
                await asyncio.sleep(settings.DATABASE_WATCH_SECONDS)
                if self.closed or await probe.alive():
                    primary_lost_at = None
                    continue
                now = self._loop.time()
                primary_lost_at = primary_lost_at or now
                failing_over = now - primary_lost_at < settings.DATABASE_FAILOVER_SECONDS
                if failing_over and await probe.standby_answers():
                    logger.warning("the primary database cannot be reached; a standby answers: waiting")
                    continue
                if not self.closed:
                    self._fail(errors.DatabaseLost())
        finally:
            await probe.close()

    def _fail(self, err: Exception) -> None:
        """Every follower gets `err`; the hub closes and a new one serves later followers."""
        if self.closed:
            return
        self._forget()
        for followers in self._followers.values():
            for follower in followers:
                follower.queue.put_nowait(err)
        for confirmed in self._subscriptions.values():
            if not confirmed.done():
                confirmed.set_exception(err)
        self._subscriptions.clear()
        self._confirmations.clear()
        self._chore(self._disconnect())

    def _forget(self) -> None:
        self.closed = True
        if _hubs.get(self._loop) is self:
            del _hubs[self._loop]

    async def _close(self) -> None:
        self._forget()
        await self._disconnect()

    async def _disconnect(self) -> None:
        await self._pubsub.aclose()
        await self._client.aclose()
        await self._backlog.aclose()


_hubs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub]" = weakref.WeakKeyDictionary()
# Set when this process stops: no new follower is taken.
_stopping = False


async def stop_following() -> None:
    """The web process is stopping: every follower of this event loop's hub gets
    ServerStopping (its stream's error event, its request cancelled), and so does any later one."""
    global _stopping
    _stopping = True
    hub = _hubs.get(asyncio.get_running_loop())
    if hub is not None:
        hub._fail(errors.ServerStopping())


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = _Hub(loop)
    return hub


async def events(request_id: UUID, on_stall: Callable[[], None] | None = None) -> AsyncIterator[Event]:
    """Yield the request's relay events from the beginning, then live ones as they come.

    The caller stops iterating when it has what it needs; a cancelled task (a client that
    went away) leaves the hub on the way out. A lost Redis connection raises RedisError, a
    lost database DatabaseLost, a requester too far behind StreamStalled (`on_stall` is
    called as the bound is passed, before the caller reads it).
    """
    if _stopping:
        raise errors.ServerStopping()
    hub = _hub()
    key = relay_key(request_id)
    follower = await hub.follow(key)
    follower.on_stall = on_stall
    try:
        last = (0, 0)
        for event in await hub.read(key, followed=followed_key(request_id)):
            last = _order(event.id)
            yield event
        while True:
            item = await follower.queue.get()
            if isinstance(item, Exception):
                raise item
            size, item = item
            follower.taken(size)
            if _order(item.id) <= last:
                continue  # read with the backlog already
            last = _order(item.id)
            yield item
    finally:
        hub.leave(follower)
