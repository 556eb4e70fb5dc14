"""Kudos awarded by a moderator: minted by the treasury, with the moderator and the reason on
the event (and in the admin's log)."""

from datetime import datetime
from decimal import Decimal
from uuid import uuid4

from kudos import ledger
from kudos.models import Event, Wallet


class InvalidAward(ValueError):
    """An award that is not a positive amount to the hundredth, or has no reason."""


def award_kudos(
    *, account_id: int, amount: Decimal, reason: str, by: str, now: datetime | None = None
) -> ledger.Posted:
    """Award `amount` kudos to the account, minted, once (each award is its own event)."""
    if amount <= 0 or amount != amount.quantize(Decimal("0.01")):
        raise InvalidAward("An award is a positive number of kudos, to the hundredth.")
    if not reason.strip():
        raise InvalidAward("An award needs a reason.")
    return ledger.post(
        kind=Event.Kind.AWARD,
        key=f"award:{account_id}:{uuid4()}",
        entries=[ledger.to_system(Wallet.System.TREASURY, -amount), ledger.to_account(account_id, amount)],
        reason=f"{reason.strip()[:400]} (by {by})",
        now=now,
    )
