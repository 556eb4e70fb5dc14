"""Posting to the kudos ledger: the one writer of events and of the balances kept from them.

An event's account wallets are locked and updated in wallet id order, so two events never wait
on each other in a cycle; system wallets keep no balance row, so no event waits on a row that
every other event writes (the hot row of an inline-balance design). A balance is up to date the
moment its event commits.
"""

from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import F

from kudos.models import Event, Posting, Wallet
from workers.models import Account


class Unbalanced(ValueError):
    """An event whose entries do not sum to zero."""


@dataclass(frozen=True)
class Entry:
    wallet: Wallet
    amount: Decimal


def account_wallet(account: Account) -> Wallet:
    wallet, _ = Wallet.objects.get_or_create(account=account)
    return wallet


def system_wallet(system: Wallet.System) -> Wallet:
    wallet, _ = Wallet.objects.get_or_create(system=system)
    return wallet


def post(*, kind: Event.Kind, key: str, entries: list[Entry], reason: str = "") -> tuple[Event, bool]:
    """Post an event of `entries` once for `key`: the event, and whether it was posted now (a
    retry of a posted key changes nothing). Entries must sum to zero; zero amounts are left out."""
    entries = [entry for entry in entries if entry.amount]
    if sum((entry.amount for entry in entries), Decimal(0)) != 0:
        raise Unbalanced(f"the entries of {kind} {key} sum to {sum(e.amount for e in entries)}")
    with transaction.atomic():
        event, created = Event.objects.get_or_create(key=key, defaults={"kind": kind, "reason": reason})
        if not created:
            return event, False
        Posting.objects.bulk_create(Posting(event=event, wallet=e.wallet, amount=e.amount) for e in entries)
        moved: dict[int, Decimal] = {}
        for entry in entries:
            if entry.wallet.account_id is not None:
                moved[entry.wallet.pk] = moved.get(entry.wallet.pk, Decimal(0)) + entry.amount
        for wallet_id in sorted(moved):  # the stable order: no two events wait on each other
            Wallet.objects.filter(pk=wallet_id).update(balance=F("balance") + moved[wallet_id])
    return event, True


def transfer(*, source: Account, target: Account, amount: Decimal, key: str) -> tuple[Event, bool]:
    """Move `amount` from one account to another, once for `key`."""
    debit, credit = account_wallet(source), account_wallet(target)
    return post(
        kind=Event.Kind.TRANSFER,
        key=key,
        entries=[Entry(debit, -amount), Entry(credit, amount)],
    )
