"""Evaluation escrow released on trust (the AI Horde's `check_for_trust`): an untrusted account
whose escrow passes KUDOS_TRUST_THRESHOLD, at least TRUST_AGE old, not flagged and not anonymous, becomes
trusted; a trusted account's escrow (whoever made it trusted) is moved to what it can spend.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from kudos import ledger
from kudos.models import Event, Wallet
from workers.models import ANONYMOUS_API_KEY_HASH, Account

TRUST_AGE = timedelta(days=7)


def release_escrow(*, now: datetime) -> list[int]:
    """Make trusted the accounts that earned it, and release every trusted account's escrow;
    return the accounts whose escrow was released."""
    threshold = settings.KUDOS_TRUST_THRESHOLD
    earned = Q(account__trusted=True)
    if threshold is not None:
        # A flagged account (`workers.suspicion`) is never trusted by its kudos.
        earned |= Q(balance__gt=threshold, account__created_at__lte=now - TRUST_AGE, account__flagged_at=None)
    candidates = (
        Wallet.objects.filter(earned, escrow=True, balance__gt=0)
        .exclude(account__api_key_hash=ANONYMOUS_API_KEY_HASH)
        .values_list("account_id", flat=True)
    )
    return [account_id for account_id in candidates if _release(account_id, now=now)]


def _release(account_id: int, *, now: datetime) -> bool:
    with transaction.atomic():
        account = Account.objects.select_for_update().get(pk=account_id)
        if not account.trusted and account.flagged_at is not None:
            return False  # flagged since it was found
        held = ledger.balance(account_id, escrow=True)
        if held <= 0:
            return False
        if not account.trusted:
            account.trusted = True
            account.save(update_fields=["trusted"])
        ledger.post(
            kind=Event.Kind.PROMOTION,
            key=f"promotion:{account_id}:{now.isoformat()}",
            entries=[ledger.to_account(account_id, -held, escrow=True), ledger.to_account(account_id, held)],
            reason="escrow released on trust",
            now=now,
        )
    return True
