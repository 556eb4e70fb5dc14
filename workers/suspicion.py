"""Suspicion: what makes an untrusted account's worker suspect, recorded with its reason, and the
flag that stops the account's workers (the AI Horde's `suspicions.py` and its uses).

- **Unreasonably fast**: a job of at least JUDGED_MIN_TOKENS delivered faster than its model's
  size allows (`speed_ceiling`, the AI Horde's ceilings for models its reference knows); one
  suspicion per such job. A short reply is not judged: handed in within a tenth of a second
  after its pop, even an honest worker's "OK." would read as hundreds of tokens a second.
- **Aborts**: each time the abort threshold puts the worker into maintenance (again), one.
- **Give-backs**: once it has given back GIVE_BACK_MIN jobs and at least GIVE_BACK_SHARE of all
  it took, one, and one more at every GIVE_BACK_MIN give-backs after while the share holds.

Trusted accounts are never suspected, the anonymous account cannot run workers. At
SUSPICION_THRESHOLD suspicions the account is flagged (`Account.flagged_at`): its workers are
offered no jobs (as a paused worker is: the pop, `jobs.services.pop`) and it is never made
trusted by its kudos (`kudos.trust`), until a moderator clears its suspicions.
"""

import logging
from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.db import transaction

from workers.models import ANONYMOUS_API_KEY_HASH, Account, Suspicion

logger = logging.getLogger(__name__)

# Tokens per second no untrusted worker is believed beyond, by model size in billions of
# parameters (the largest size the model reaches first), and for smaller or mixed models.
SPEED_CEILINGS = ((70, 30.0), (14, 100.0), (8, 150.0))
DEFAULT_SPEED_CEILING = 150.0
# Mixture-of-experts models ("8x7B") run faster than their size says (the AI Horde's x3).
MIXTURE_FACTOR = 3
JUDGED_MIN_TOKENS = 64
GIVE_BACK_MIN = 10
GIVE_BACK_SHARE = 0.5


def speed_ceiling(model: str, billions: float | None) -> float | None:
    """The most tokens per second an untrusted worker serving `model` (of `billions`, None when
    the model table does not know it: then no ceiling) is believed to deliver."""
    if billions is None:
        return None
    ceiling = next((speed for size, speed in SPEED_CEILINGS if billions >= size), DEFAULT_SPEED_CEILING)
    return ceiling * MIXTURE_FACTOR if "8x" in model else ceiling


def gives_back_too_much(*, given_back: int, completed: int) -> bool:
    """Whether this give-back (the worker's `given_back`-th, with `completed` jobs done) is
    one to suspect it for."""
    share = given_back / max(1, given_back + completed)
    return given_back >= GIVE_BACK_MIN and given_back % GIVE_BACK_MIN == 0 and share >= GIVE_BACK_SHARE


def report(*, account_id: int, worker_id: UUID | None, reason: str, detail: str, now: datetime) -> bool:
    """Record a suspicion of an untrusted account (nothing for a trusted one) and flag it at
    SUSPICION_THRESHOLD; return whether it was flagged now. In the caller's transaction, if any."""
    with transaction.atomic():
        account = Account.objects.select_for_update(no_key=True).filter(pk=account_id, trusted=False).first()
        if account is None:
            return False
        Suspicion.objects.create(
            account_id=account_id, worker_id=worker_id, reason=reason, detail=detail[:200], created_at=now
        )
        logger.warning("account %s suspected (%s): %s", account_id, reason, detail)
        if account.flagged_at is not None:
            return False
        if Suspicion.objects.filter(account_id=account_id).count() < settings.SUSPICION_THRESHOLD:
            return False
        Account.objects.filter(pk=account_id).update(flagged_at=now)
    logger.warning("account %s flagged: its workers are offered no jobs", account_id)
    return True


def flag(*, accounts, now: datetime) -> list[Account]:
    """A moderator's flag, as SUSPICION_THRESHOLD suspicions would set it: the accounts' workers
    are offered no jobs and they are never trusted by their kudos, until cleared (`clear`). The
    anonymous account is never flagged, as on the AI Horde. Returns those flagged now."""
    with transaction.atomic():
        flagging = list(
            accounts.select_for_update().filter(flagged_at=None).exclude(api_key_hash=ANONYMOUS_API_KEY_HASH)
        )
        Account.objects.filter(pk__in=[a.pk for a in flagging]).update(flagged_at=now)
    for account in flagging:
        logger.warning("account %s flagged by a moderator: its workers are offered no jobs", account.pk)
    return flagging


def clear(*, accounts) -> int:
    """A moderator's verdict: forget the accounts' suspicions and lift their flag."""
    with transaction.atomic():
        Suspicion.objects.filter(account__in=accounts).delete()
        return accounts.exclude(flagged_at=None).update(flagged_at=None)
