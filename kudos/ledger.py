"""Posting to the kudos ledger: the one writer of events and of the balances kept from them.

An event posts in one statement (`kudos.sql.post_event`), on its own or carried by the
statement of what it pays for. Its account wallets are locked and updated in (account, escrow)
order, so two events never wait on each other in a cycle; system wallets keep no balance, so
no event waits on a row that every other event writes (the hot row of an inline-balance
design). A balance is up to date, and spendable, the moment its event commits.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from django.db import connection

from hordeops import clock
from kudos import sql
from kudos.models import Event, Wallet
from workers.models import ANONYMOUS_API_KEY_HASH

ZERO = Decimal("0.00")


class Unbalanced(ValueError):
    """An event whose entries do not sum to zero."""


@dataclass(frozen=True)
class Entry:
    """What an event moves in (positive) or out of one wallet: an account's (its escrow if
    `escrow`) or a system wallet."""

    amount: Decimal
    account_id: int | None = None
    escrow: bool = False
    system: Wallet.System | None = None


def to_account(account_id: int, amount: Decimal, *, escrow: bool = False) -> Entry:
    return Entry(amount=amount, account_id=account_id, escrow=escrow)


def to_system(system: Wallet.System, amount: Decimal) -> Entry:
    return Entry(amount=amount, system=system)


class Posted(NamedTuple):
    event_id: int
    posted: bool  # False for a retry of a key already posted: it changed nothing
    forgiven: Decimal  # what the floor forgave


def event_params(
    *,
    kind: Event.Kind,
    key: str,
    entries: list[Entry],
    now: datetime,
    reason: str = "",
    records: dict[int, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The parameters of `kudos.sql.post_event` for one event. Entries must sum to zero; those
    to one wallet are merged, zero amounts left out (unless the wallet keeps `records` of the
    event: `Event.records`, by account id), account wallets in their locking order."""
    accounts: dict[tuple[int, bool], Decimal] = {}
    systems: dict[str, Decimal] = {}
    for entry in entries:
        if entry.account_id is not None:
            wallet = (entry.account_id, entry.escrow)
            accounts[wallet] = accounts.get(wallet, ZERO) + entry.amount
        else:
            systems[entry.system] = systems.get(entry.system, ZERO) + entry.amount
    total = sum(accounts.values(), ZERO) + sum(systems.values(), ZERO)
    if total != 0:
        raise Unbalanced(f"the entries of {kind} {key} sum to {total}")
    for account_id in records or {}:
        accounts.setdefault((account_id, False), ZERO)
    # As JSON text, each a parameter psycopg sends as it is (arrays of numbers cost it more).
    moved = [
        [account_id, escrow, str(amount), None if escrow or not amount else Event.action(kind, amount)]
        for (account_id, escrow), amount in sorted(accounts.items())
        if amount or (not escrow and account_id in (records or {}))
    ]
    minted = {str(system): str(amount) for system, amount in systems.items() if amount}
    return {
        "k_kind": kind.value,
        "k_key": key,
        "k_reason": reason,
        "k_now": now,
        "k_anonymous": ANONYMOUS_API_KEY_HASH,
        "k_moves": json.dumps(moved),
        "k_systems": json.dumps(minted),
        "k_records": json.dumps({str(account): kept for account, kept in records.items()})
        if records
        else None,
    }


def post(
    *,
    kind: Event.Kind,
    key: str,
    entries: list[Entry],
    reason: str = "",
    now: datetime | None = None,
    records: dict[int, dict[str, int]] | None = None,
) -> Posted:
    """Post an event of `entries` once for `key` (a retry of a posted key changes nothing)."""
    return post_params(
        event_params(
            kind=kind, key=key, entries=entries, now=now or clock.now(), reason=reason, records=records
        )
    )


def post_params(params: dict[str, Any]) -> Posted:
    """Post the event of `event_params` once for its key, in a statement of its own."""
    with connection.cursor() as cursor:
        cursor.execute(sql.post(), params)
        event_id, forgiven = cursor.fetchone()
    if event_id is None:
        return Posted(Event.objects.get(key=params["k_key"]).pk, posted=False, forgiven=ZERO)
    return Posted(event_id, posted=True, forgiven=forgiven)


def balance(account_id: int, *, escrow: bool = False) -> Decimal:
    """An account's spendable balance (or its escrow): zero until its first movement."""
    found = (
        Wallet.objects.filter(account_id=account_id, escrow=escrow).values_list("balance", flat=True).first()
    )
    return found if found is not None else ZERO
