"""Moderators' messages to workers, as each pop delivers them (`messages`, the AI Horde's shape).

Every pop answers with its worker's messages, so each process keeps a snapshot of the messages
not yet expired, read whole at most every SNAPSHOT_SECONDS: a pop costs no statement for them.
A message saved in this process is seen at once, in others within that.

The AI Horde's routes on them (`/api/v2/workers/messages`, `base.WorkerMessages`) read and write
them with the rules below; `front.worker_messages` serves them and logs a moderator's writes.
"""

import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta
from email.utils import formatdate
from uuid import UUID

from django.db.models import Q

from hordeops import errors
from hordeops.parsing import ascii_int
from workers.details import unique_alias
from workers.models import Account, Worker, WorkerMessage

# The AI Horde's bounds: 50 messages a page, at most 30 days, 12 hours when not said.
PAGE_SIZE = 50
MAX_HOURS = 30 * 24
DEFAULT_HOURS = 12
VALIDITIES = ("active", "expired", "all")

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


def rfc822(moment: datetime) -> str:
    """A time as the AI Horde marshals its `fields.DateTime(dt_format="rfc822")`."""
    return formatdate(moment.timestamp())


def details(row: WorkerMessage) -> dict:
    """The AI Horde's `ResponseModelMessage` (None left out, as it marshals with skip_none)."""
    shown = {
        "id": str(row.pk),
        "worker_id": str(row.worker_id),
        "message": row.message,
        "origin": row.origin,
        "expiry": rfc822(row.expiry),
        "created": rfc822(row.created_at),
    }
    if row.author_id is not None:
        shown["user_id"] = str(row.author_id)
    return shown


def listed(
    *, viewer: Account, user_id: str | None, worker_id: UUID | None, validity: str, page: int, now: datetime
) -> list[dict]:
    """The messages `viewer` may read, a page of PAGE_SIZE, oldest first.

    A moderator reads every message, `user_id` narrowing to that account's workers; anyone else
    reads the messages to their own workers (whoever wrote them) and may name only themselves."""
    if not viewer.moderator and user_id is not None and user_id != str(viewer.pk):
        raise errors.Forbidden("You can only view your own messages.")
    if validity not in VALIDITIES:
        raise errors.BadRequest("validity can only be one of 'active, 'expired', or 'all'")
    rows = WorkerMessage.objects.order_by("created_at", "id")
    if not viewer.moderator:
        rows = rows.filter(worker__account_id=viewer.pk)
    elif user_id is not None:
        account_id = ascii_int(user_id)
        if account_id is None:
            raise errors.BadRequest("user_id must be a user's numerical id.")
        rows = rows.filter(worker__account_id=account_id)
    if worker_id is not None:
        rows = rows.filter(worker_id=worker_id)
    if validity != "all":
        active = Q(expiry__gt=now)
        rows = rows.filter(active if validity == "active" else ~active)
    first = (page - 1) * PAGE_SIZE
    return [details(row) for row in rows[first : first + PAGE_SIZE]]


def send(
    *, author: Account, worker_id: UUID, message: str, origin: str | None, hours: int, now: datetime
) -> WorkerMessage:
    """A message to a worker, delivered by its pops for `hours`: a moderator's to any worker,
    with the origin they choose; an owner's to their own, its origin their id (the AI Horde's)."""
    if author.is_anonymous:
        raise errors.AnonForbidden()
    worker = Worker.objects.live().filter(pk=worker_id).first()
    if worker is None:
        raise errors.WorkerNotFound(f"Worker with ID '{worker_id}' not found.")
    if not author.moderator:
        if worker.account_id != author.pk:
            raise errors.MessagesOnlyOwnWorkers()
        origin = str(author.pk)
    return WorkerMessage.objects.create(
        worker=worker,
        message=message,
        origin=origin or WorkerMessage._meta.get_field("origin").default,
        expiry=now + timedelta(hours=hours),
        created_by=unique_alias(author)[:150],
        author=author,
        created_at=now,
    )


def find(message_id: str) -> WorkerMessage:
    """The message of that id, or the AI Horde's ThingNotFound."""
    pk = ascii_int(message_id)
    row = WorkerMessage.objects.filter(pk=pk).first() if pk is not None else None
    if row is None:
        raise errors.WorkerMessageNotFound(message_id)
    return row


def deletable(*, caller: Account, message_id: str) -> WorkerMessage:
    """The message `caller` may delete: one they wrote, or any for a moderator."""
    row = find(message_id)
    if row.author_id != caller.pk and not caller.moderator:
        raise errors.Forbidden("You can only delete your own messages.")
    return row
