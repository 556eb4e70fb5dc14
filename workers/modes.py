"""The horde's modes (`HordeModes`, one row), as the routes read them.

Maintenance is read at every queueing, so each process keeps a snapshot for SNAPSHOT_SECONDS
(a change made in this process is seen at once, in others within that); invite-only and raid
are read afresh, on the rare path where a pop has just created a worker.
"""

import threading
import time
from dataclasses import dataclass

from workers.models import HordeModes

SNAPSHOT_SECONDS = 5


@dataclass(frozen=True)
class Modes:
    maintenance: bool = False
    invite_only: bool = False
    raid: bool = False


_lock = threading.Lock()
_snapshot: tuple[float, Modes] | None = None


def read() -> Modes:
    """The modes as the database holds them now (all off before a moderator first sets one)."""
    row = HordeModes.objects.filter(pk=1).values("maintenance", "invite_only", "raid").first()
    return Modes(**row) if row else Modes()


def set_modes(**changes: bool) -> Modes:
    """Set some of the modes (`maintenance`, `invite_only`, `raid`), as moderators do in the
    admin or through `PUT /api/v2/status/modes`; every process sees them within SNAPSHOT_SECONDS
    (this one at once: the save's signal drops its snapshot). Returns the modes as now set."""
    row, _ = HordeModes.objects.get_or_create(pk=1)
    for name, value in changes.items():
        setattr(row, name, value)
    row.save()
    return Modes(maintenance=row.maintenance, invite_only=row.invite_only, raid=row.raid)


def current() -> Modes:
    """The modes, at most SNAPSHOT_SECONDS old."""
    global _snapshot
    snapshot = _snapshot
    if snapshot is not None and time.monotonic() - snapshot[0] < SNAPSHOT_SECONDS:
        return snapshot[1]
    modes = read()
    with _lock:
        _snapshot = (time.monotonic(), modes)
    return modes


def forget(**kwargs) -> None:
    """Drop this process's snapshot (on a save of the modes, and between tests)."""
    global _snapshot
    with _lock:
        _snapshot = None
