"""The read replica: which reads may be served by it (DATABASE_REPLICA_URL, the `replica`
database), and the router that sends them there.

Only reads a route opts into (`reads`, `replica_reads`) go to the replica, and only while the
request has written nothing: the first write of a request sends its later reads to the primary,
so that it reads its own writes. The routes that opt in are the ones whose answers are already
seconds old by design (the discovery routes' caches, the admin's lists); everything that decides
a pop, a lease, a submit or a spend reads the primary, as does every write. Sessions, users and
the admin's log always use the primary: a moderator who just logged in is not sent back to the
login page by a replica a moment behind. docs/reference/operations.md states the lag each route
tolerates.

A replica that cannot be reached costs these routes nothing but time: the read is done again on
the primary, and for DOWN_SECONDS every process that saw it fail reads the primary at once.
"""

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

REPLICA = "replica"
# After the replica failed to answer, how long this process reads the primary instead.
DOWN_SECONDS = 5.0
_down_until = 0.0
# Apps whose rows decide who the caller is: always read where they were written.
PRIMARY_APPS = frozenset({"sessions", "auth", "admin", "contenttypes"})

_allowed: ContextVar[bool] = ContextVar("replica_reads_allowed", default=False)
_wrote: ContextVar[bool] = ContextVar("request_wrote", default=False)


def configured() -> bool:
    return REPLICA in connections.settings


def alias() -> str:
    """Where a read of the current code may go: the replica inside `reads`, until a write."""
    if _allowed.get() and not _wrote.get() and configured() and time.monotonic() >= _down_until:
        return REPLICA
    return DEFAULT_DB_ALIAS


def run(view: Callable, *args, **kwargs):
    """Run `view` with its reads on the replica; if the replica cannot be reached, again on the
    primary (a read-only view: running it twice changes nothing)."""
    global _down_until
    if not configured() or time.monotonic() < _down_until:
        return view(*args, **kwargs)
    try:
        with reads():
            response = view(*args, **kwargs)
            if getattr(response, "template_name", None) and not response.is_rendered:
                # A page's queries run as its template renders: here, on the replica, not after.
                # (An API answer holds its data already, and is rendered by its framework.)
                response.render()
            return response
    except (OperationalError, InterfaceError) as failed:
        if not _replica_failed():
            raise
        _down_until = time.monotonic() + DOWN_SECONDS
        logger.warning("read replica unavailable (%s): reading the primary", type(failed).__name__)
        connections[REPLICA].close()
        return view(*args, **kwargs)


def _replica_failed() -> bool:
    """Whether the replica's connection is the one that failed (not the primary's)."""
    replica = connections[REPLICA]
    return replica.connection is None or replica.errors_occurred or not replica.is_usable()


@contextmanager
def reads() -> Iterator[None]:
    """Let the reads inside go to the replica (until the first write)."""
    allowed, wrote = _allowed.set(True), _wrote.set(False)
    try:
        yield
    finally:
        _allowed.reset(allowed)
        _wrote.reset(wrote)


def replica_reads(view: Callable) -> Callable:
    """A read-only view (or a view method) whose reads may be served by the replica."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        return run(view, *args, **kwargs)

    return wrapped


class ReplicaRouter:
    """Django's router for `reads` (DATABASE_ROUTERS). Without a replica it routes nothing."""

    def db_for_read(self, model, **hints) -> str | None:
        if model._meta.app_label in PRIMARY_APPS:
            return DEFAULT_DB_ALIAS
        return alias()

    def db_for_write(self, model, **hints) -> str:
        _wrote.set(True)
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        return True  # the same rows, wherever they were read

    def allow_migrate(self, db, app_label, model_name=None, **hints) -> bool:
        return db == DEFAULT_DB_ALIAS
