"""Database work for async views: a few shared threads, and no connection held between statements.

An open chat request waits and streams on the event loop for as long as its requester likes;
it must hold neither a thread nor a pooled PostgreSQL connection meanwhile (the open
requests' bound). So each of its database steps (queue the request, commit the stream, cancel)
runs through `run`: on one of WEB_ASYNC_DB_THREADS threads shared by every async request of
the process, and its connection goes back to the pool as soon as the step returns. The
connections a process uses for requesters are thus bounded by those threads, whatever the
number of open streams.

A step is all or nothing for its caller: cancelled (a client gone, a deadline spent) before a
thread took it, it never runs; cancelled while it runs, it is waited for (steps take
milliseconds) and `undo` is given its result, so that what it made is not left behind.

A sync view that ends on the event loop (a waiting pop) runs its later steps on the threads
that serve sync views (`run_on_view_threads`, `view_threads`): where its view ran, and not
behind the async views' steps.

When an async view is driven from sync code (Django's test client, `async_to_sync`), the
step runs on that caller's thread instead, inside its transaction, as Django's own
`sync_to_async` does.
"""

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import AsyncToSync, sync_to_async
from django.conf import settings
from django.db import connection

T = TypeVar("T")

_pools: dict[str, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _pool(name: str, size: int) -> ThreadPoolExecutor:
    with _pool_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)
        return _pools[name]


def _threads() -> ThreadPoolExecutor:
    return _pool("hordeops-asyncdb", settings.WEB_ASYNC_DB_THREADS)


def view_threads() -> ThreadPoolExecutor:
    """The WEB_SYNC_THREADS threads that serve the process's sync views (`hordeops.asgi`)."""
    return _pool("hordeops-sync", settings.WEB_SYNC_THREADS)


def _closing(call: Callable[[], T]) -> T:
    try:
        return call()
    finally:
        connection.close()  # back to the pool: nothing is held until the next step


def _under_sync_caller() -> bool:
    return getattr(AsyncToSync.executors, "current", None) is not None


async def run(
    fn: Callable[..., T], /, *args: Any, undo: Callable[[T], Any] | None = None, **kwargs: Any
) -> T:
    """`fn(*args, **kwargs)` on a database thread; see the module's docstring."""
    return await _run(_threads(), functools.partial(fn, *args, **kwargs), undo)


async def run_on_view_threads(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`run`, on the sync views' threads: the step of a sync view that ends on the event loop
    (a waiting pop's pop) runs where its view ran, not behind the async views' steps."""
    return await _run(view_threads(), functools.partial(fn, *args, **kwargs), None)


async def _run(threads: ThreadPoolExecutor, call: Callable[[], T], undo: Callable[[T], Any] | None) -> T:
    if _under_sync_caller():
        return await sync_to_async(call, thread_sensitive=True)()
    context = contextvars.copy_context()
    future = threads.submit(context.run, _closing, call)
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        if future.cancel():
            raise  # never started
        try:
            result = await asyncio.wrap_future(future)
        except Exception:
            raise asyncio.CancelledError from None  # it failed: nothing to undo
        if undo is not None:
            await asyncio.wrap_future(threads.submit(_closing, functools.partial(undo, result)))
        raise
