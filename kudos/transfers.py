"""Kudos transfers between accounts (the AI Horde's `POST /v2/kudos/transfer`): from what the
sender may spend (`kudos.holds`), once per Idempotency-Key, never straight back."""

import hashlib
import re
from datetime import timedelta
from decimal import Decimal
from uuid import uuid4

from django.db import connection, transaction
from django.db.models import F

from hordeops import clock, errors, ratelimit
from kudos import holds, ledger, sql
from kudos.models import Event, Posting
from workers import shared_keys
from workers.models import Account, SharedKey

# After a transfer, the receiver may not send kudos back to its sender for this long (the AI
# Horde's guard against two accounts passing kudos to and fro).
REVERSE_WAIT = timedelta(seconds=60)


# What a client may send as an Idempotency-Key: UUIDs, ULIDs, base64 and the like, short
# enough to keep in logs. Stated in docs/reference/horde_api.md.
IDEMPOTENCY_KEY_MAX = 128
IDEMPOTENCY_KEY_PATTERN = rf"^[A-Za-z0-9._~+/=:-]{{1,{IDEMPOTENCY_KEY_MAX}}}$"
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)


def idempotency_key(*, header: str | None) -> str | None:
    """The Idempotency-Key header as a transfer takes it (None when absent or empty); refused
    (400 `InvalidIdempotencyKey`) outside its characters and length, before any limit is spent."""
    if not header:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(header):
        message = (
            f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} characters of letters, digits "
            "and . _ ~ + / = : -"
        )
        raise _refused(message, "InvalidIdempotencyKey")
    return header


# The AI Horde's limits on one account's transfers: one a second and 90 an hour.
RATES = ((1.0, 1, "second"), (90 / 3600, 90, "hour"))


def take_rate(*, account_id: int) -> None:
    """Spend one of the account's transfers (`RATES`), on the route and the account page alike,
    or refuse (429) with the wait. Kept per account, not per key: a reset key does not start afresh."""
    buckets = [
        ratelimit.Bucket(f"hordeops:rate:transfer:{per}:{account_id}", rate, burst)
        for rate, burst, per in RATES
    ]
    if wait := ratelimit.take(buckets):
        raise errors.RateLimited(wait_seconds=wait, refusal="transfers")


def _event_key(source_id: int, client_key: str) -> str:
    """The transfer's ledger key: its kind's prefix and a hash of the client's key, so that no
    key a client sends can name another event (a `:floor` suffix, another kind's prefix)."""
    return f"transfer:{source_id}:{hashlib.sha256(client_key.encode()).hexdigest()}"


def _refused(message: str, rc: str) -> errors.KudosValidationError:
    return errors.KudosValidationError(message, rc=rc)


def _target(username: str) -> tuple[Account | None, SharedKey | None]:
    """The account a username names as the AI Horde reads it: by the id after its last `#`,
    or, a shared key's id, the key's owner with the key (a transfer to it tops it up); None for
    a suspended one, which can no more receive than a deleted one (told apart by nothing, so a
    transfer does not reveal a moderator's action). An expired key: 400 `SharedKeyExpired`."""
    digits = username.rsplit("#", 1)[-1].strip()
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:
        return Account.objects.filter(pk=int(digits), suspended_at__isnull=True).first(), None
    key = shared_keys.find(username)
    if key is None or key.account.suspended_at is not None:
        return None, None
    if key.is_expired(clock.now()):
        raise _refused(errors.SharedKeyExpired.default_message, "SharedKeyExpired")
    return key.account, key


def transfer_kudos(*, source: Account, username: str, amount: int, idempotency_key: str | None = None) -> int:
    """Move `amount` kudos from `source` to the account `username` names; return what moved.

    Refused (KudosValidationError, with the AI Horde's rc) from or to the anonymous account,
    from or to a flagged account (`Account.flagged_at`), to a suspended or unknown account, to
    oneself, for an amount not positive, back to an account that sent to `source` within a
    minute, or past what `source` may spend (`kudos.holds`), decided under the lock on `source`
    that queueing takes. A retry with the same Idempotency-Key moves nothing and answers the
    same; the key with another transfer is refused. To a shared key's id, the kudos go to its
    owner and its budget (unless unlimited) grows by them, in the same transaction."""
    if source.is_anonymous:
        raise _refused("You cannot transfer Kudos from Anonymous, smart-ass.", "KudosTransferFromAnon")
    target, shared_key = _target(username)
    if target is None:
        raise _refused("Invalid target username.", "InvalidTargetUsername")
    if target.is_anonymous:
        message = "Tried to burn kudos via sending to Anonymous. Assuming PEBKAC and aborting."
        raise _refused(message, "KudosTransferToAnon")
    if target.pk == source.pk:
        raise _refused("Cannot send kudos to yourself, ya monkey!", "KudosTransferToSelf")
    if source.flagged_at is not None:
        # The AI Horde's rc, where it checks it; of its two flagged messages, the one that
        # speaks to the sender (it gives them the other way round).
        message = "Your account has been flagged for suspicious activity. Please contact the mods."
        raise _refused(message, "SourceAccountFlagged")
    if target.flagged_at is not None:
        # The AI Horde's rc; its words for it are the sender's, so these say whose account it is.
        message = "The target account has been flagged for suspicious activity. Please contact the mods."
        raise _refused(message, "TargetAccountFlagged")
    if amount < 0:
        raise _refused("Nice try...", "NegativeKudosTransfer")
    if amount == 0:
        raise _refused("Transfer amount must be positive.", "InvalidKudosTransferAmount")
    now = clock.now()
    key = _event_key(source.pk, idempotency_key or str(uuid4()))
    moved = Decimal(amount)
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The pair's lock before the sender's, always: A to B and B to A at once would
            # otherwise both read no guard; no transfer waits for it holding an account lock.
            pair = "-".join(map(str, sorted((source.pk, target.pk))))
            cursor.execute(sql.LOCK_TRANSFER_PAIR, {"pair": pair})
            cursor.execute(sql.LOCK_ACCOUNT, {"account_id": source.pk})
            if idempotency_key and Event.objects.filter(key=key).exists():
                return _replayed(key, source=source, target=target, amount=moved)
            # The guard is the ledger's own: a transfer the other way, committed before this
            # one took the pair's lock, or rolled back and so never there.
            guard = {"target": target.pk, "source": source.pk, "since": now - REVERSE_WAIT}
            cursor.execute(sql.SENT_SINCE, guard)
            (sent_back,) = cursor.fetchone()
        if sent_back:
            message = "This user transferred kudos to you very recently. Please wait at least 1 minute."
            raise _refused(message, "TooFastKudosTransfers")
        if holds.available(account_id=source.pk, pseudonymous=source.pseudonymous) < moved:
            raise _refused("Not enough kudos.", "KudosTransferNotEnough")
        ledger.post(
            kind=Event.Kind.TRANSFER,
            key=key,
            entries=[ledger.to_account(source.pk, -moved), ledger.to_account(target.pk, moved)],
            now=now,
        )
        if shared_key is not None:
            SharedKey.objects.filter(pk=shared_key.pk).exclude(kudos=SharedKey.UNLIMITED).update(
                kudos=F("kudos") + moved
            )
    return amount


def _replayed(key: str, *, source: Account, target: Account, amount: Decimal) -> int:
    """A retry of a posted transfer: the same one answers what it moved, another is refused."""
    moved = set(Posting.objects.filter(event__key=key).values_list("wallet__account_id", "amount"))
    if moved != {(source.pk, -amount), (target.pk, amount)}:
        message = "Idempotency key was already used with different transfer parameters."
        raise _refused(message, "IdempotencyKeyConflict")
    return int(amount)
