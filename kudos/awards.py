"""Kudos awarded by a moderator: minted by the treasury, with the moderator and the reason on
the event (and in the admin's log). The admin's award page and the API's
(`POST /api/v2/kudos/award`, `PUT /api/v2/users/{id}` `kudos`) both award through `award_kudos`."""

from datetime import datetime
from decimal import Decimal
from uuid import uuid4

from hordeops import errors
from kudos import ledger
from kudos.models import Event, Wallet
from workers.models import Account

# The most one award mints: the admin form's twelve digits (a balance keeps eighteen).
MAX_AWARD = Decimal("9999999999.99")


class InvalidAward(ValueError):
    """An award that is not a positive amount to the hundredth, or has no reason."""


def award_kudos(
    *, account_id: int, amount: Decimal, reason: str, by: str, now: datetime | None = None
) -> ledger.Posted:
    """Award `amount` kudos to the account, minted, once (each award is its own event)."""
    if amount <= 0 or amount != amount.quantize(Decimal("0.01")):
        raise InvalidAward("An award is a positive number of kudos, to the hundredth.")
    if amount > MAX_AWARD:
        raise InvalidAward(f"An award is at most {MAX_AWARD} kudos.")
    if not reason.strip():
        raise InvalidAward("An award needs a reason.")
    return ledger.post(
        kind=Event.Kind.AWARD,
        key=f"award:{account_id}:{uuid4()}",
        entries=[ledger.to_system(Wallet.System.TREASURY, -amount), ledger.to_account(account_id, amount)],
        reason=f"{reason.strip()[:400]} (by {by})",
        now=now,
    )


def _refused(message: str, rc: str) -> errors.KudosValidationError:
    return errors.KudosValidationError(message, rc=rc)


def award_target(account: Account | None) -> Account:
    """The account an award goes to, or the AI Horde's refusal (`AwardKudos`): no such account,
    the anonymous one, or a flagged one."""
    if account is None:
        raise _refused("Invalid target username.", "InvalidAwardUsername")
    if account.is_anonymous:
        raise _refused("Cannot award anon. No go.", "KudosAwardToAnon")
    if account.flagged_at is not None:
        # The AI Horde turns a flagged account away with these words (and no rc of its own).
        message = "Target user is rejected: it is flagged for suspicious activity."
        raise _refused(message, "TargetAccountFlagged")
    return account


def account_named(username: str) -> Account | None:
    """The account a username names as the AI Horde reads it: by the id after its last `#`
    (`alice#12`, or `12`)."""
    digits = username.rsplit("#", 1)[-1].strip()
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:
        return Account.objects.filter(pk=int(digits)).first()
    return None
