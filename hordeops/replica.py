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
"""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.db import DEFAULT_DB_ALIAS, connections

REPLICA = "replica"
# Apps whose rows decide who the caller is: always read where they were written.
PRIMARY_APPS = frozenset({"sessions", "auth", "admin", "contenttypes"})

_allowed: ContextVar[bool] = ContextVar("replica_reads_allowed", default=False)
_wrote: ContextVar[bool] = ContextVar("request_wrote", default=False)


def configured() -> bool:
    return REPLICA in connections.settings


def alias() -> str:
    """Where a read of the current code may go: the replica inside `reads`, until a write."""
    return REPLICA if _allowed.get() and not _wrote.get() and configured() else DEFAULT_DB_ALIAS


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
    """A view (or a view method) whose reads may be served by the replica."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        with reads():
            return view(*args, **kwargs)

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
