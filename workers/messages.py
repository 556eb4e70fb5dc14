"""Moderators' messages to workers, as each pop delivers them (`messages`, the AI Horde's shape).

Every pop answers with its worker's messages, so each process keeps a snapshot of the messages
not yet expired, read whole at most every SNAPSHOT_SECONDS: a pop costs no statement for them.
A message saved in this process is seen at once, in others within that.
"""

import threading
import time
from collections import defaultdict
from datetime import datetime
from email.utils import formatdate
from uuid import UUID

from workers.models import WorkerMessage

SNAPSHOT_SECONDS = 5

_lock = threading.Lock()
_snapshot: tuple[float, dict[UUID, list[tuple[datetime, dict]]]] | None = None


def _current(now: datetime) -> dict[UUID, list[tuple[datetime, dict]]]:
    global _snapshot
    snapshot = _snapshot
    if snapshot is not None and time.monotonic() - snapshot[0] < SNAPSHOT_SECONDS:
        return snapshot[1]
    by_worker: dict[UUID, list[tuple[datetime, dict]]] = defaultdict(list)
    rows = WorkerMessage.objects.filter(expiry__gt=now).order_by("created_at")
    for row in rows.values("id", "worker_id", "message", "origin", "expiry"):
        shown = {
            "id": str(row["id"]),
            "message": row["message"],
            "origin": row["origin"],
            # RFC 822, as the AI Horde marshals it.
            "expiry": formatdate(row["expiry"].timestamp()),
        }
        by_worker[row["worker_id"]].append((row["expiry"], shown))
    with _lock:
        _snapshot = (time.monotonic(), dict(by_worker))
    return _snapshot[1]


def for_worker(worker_id: UUID | None, now: datetime) -> list[dict]:
    """The worker's messages that have not expired at `now`, oldest first."""
    if worker_id is None:
        return []
    return [shown for expiry, shown in _current(now).get(worker_id, ()) if expiry > now]


def forget(**kwargs) -> None:
    """Drop this process's snapshot (on a save or delete of a message, and between tests)."""
    global _snapshot
    with _lock:
        _snapshot = None
