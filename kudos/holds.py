"""What an account may spend: its balance less its floor less what its holds keep.

A hold (`kudos.models.Hold`) is what one active request still keeps of its account's kudos: its
cost when it was queued, less what its generations were charged since. The app that queues
requests places, draws down and releases them in the statements that queue, charge and end a
request (`kudos.sql.hold`, `draw_holds`, `release_holds`), or with `draw` and `release` here
on its other paths; it also says which holds disagree with its requests (`register_check`), as
`python manage.py check_kudos` reports them. What may be spent is read, and spent, under the
account's lock (`kudos.sql.LOCK_ACCOUNT`).
"""

from collections.abc import Callable, Iterable
from decimal import Decimal
from uuid import UUID

from django.db import connection
from django.db.models import F, Value
from django.db.models.functions import Greatest

from kudos import rates, sql
from kudos.models import ZERO, Hold


def available(*, account_id: int, anonymous: bool = False, pseudonymous: bool = False) -> Decimal:
    """What the account may spend now. Read after `kudos.sql.LOCK_ACCOUNT` in the caller's
    transaction, and spent in it, for the answer to hold until it commits."""
    floor = rates.floor(anonymous=anonymous, pseudonymous=pseudonymous)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql.available()}", {"account_id": account_id, "floor": floor})
        (amount,) = cursor.fetchone()
    return amount


def draw(*, request_id: UUID, charged: Decimal) -> None:
    """Draw the request's hold down by what one of its generations was charged."""
    if charged:
        Hold.objects.filter(request_id=request_id).update(amount=Greatest(F("amount") - charged, Value(ZERO)))


def release(*, request_ids: Iterable[UUID]) -> None:
    """Release the holds of requests that ended."""
    Hold.objects.filter(request_id__in=list(request_ids)).delete()


# Checks of the holds against what they are for, by the app that places them: each returns a
# line per hold that disagrees (or per request that should hold and does not).
_checks: list[Callable[[], list[str]]] = []


def register_check(check: Callable[[], list[str]]) -> None:
    if check not in _checks:
        _checks.append(check)


def disagreements() -> list[str]:
    """What every registered check finds (`python manage.py check_kudos`)."""
    return [line for check in _checks for line in check()]
