"""The kudos ledger (`kudos.ledger`): balanced, append-only events, each business key posted
once, and balances that match their postings, under concurrent posting too."""

import threading
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, connections, transaction

from kudos import ledger
from kudos.ledger import Entry
from kudos.models import Event, Posting, Wallet
from workers.services import create_account


def _account(name: str):
    account, _ = create_account(name=name)
    return account


def _balance(account) -> Decimal:
    return Wallet.objects.get(account=account).balance


def _award(account, amount: str, key: str) -> tuple[Event, bool]:
    return ledger.post(
        kind=Event.Kind.AWARD,
        key=key,
        entries=[
            Entry(ledger.system_wallet(Wallet.System.TREASURY), -Decimal(amount)),
            Entry(ledger.account_wallet(account), Decimal(amount)),
        ],
    )


def test_an_award_is_minted_by_the_treasury_and_the_ledger_sums_to_zero(db):
    alice = _account("alice")
    event, posted = _award(alice, "12.50", "award:1")
    assert posted and _balance(alice) == Decimal("12.50")
    assert Posting.objects.total() == 0
    assert Posting.objects.filter(wallet__system=Wallet.System.TREASURY).total() == Decimal("-12.50")
    call_command("check_kudos")


def test_a_retried_event_posts_nothing_twice(db):
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "10", "award:a")
    first = ledger.transfer(source=alice, target=bob, amount=Decimal("3"), key="transfer:k1")
    again = ledger.transfer(source=alice, target=bob, amount=Decimal("3"), key="transfer:k1")
    assert (first[1], again[1], first[0].pk) == (True, False, again[0].pk)
    assert (_balance(alice), _balance(bob)) == (Decimal("7.00"), Decimal("3.00"))


def test_entries_that_do_not_sum_to_zero_are_refused_before_and_at_commit(transactional_db):
    alice = _account("alice")
    with pytest.raises(ledger.Unbalanced):
        ledger.post(
            kind=Event.Kind.AWARD, key="bad", entries=[Entry(ledger.account_wallet(alice), Decimal(5))]
        )
    wallet = ledger.account_wallet(alice)
    # Past the service, the database itself refuses an unbalanced event when it commits.
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            event = Event.objects.create(kind=Event.Kind.AWARD, key="forged")
            Posting.objects.create(event=event, wallet=wallet, amount=Decimal(5))
    assert not Event.objects.filter(key="forged").exists()


def test_postings_and_events_are_never_updated_or_deleted(db):
    alice = _account("alice")
    event, _ = _award(alice, "1", "award:x")
    for change in (
        lambda: Posting.objects.filter(event=event).update(amount=Decimal(2)),
        lambda: Posting.objects.filter(event=event).delete(),
        lambda: Event.objects.filter(pk=event.pk).update(reason="rewritten"),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            change()


def test_check_kudos_fails_on_a_balance_that_drifted_from_its_postings(db):
    alice = _account("alice")
    _award(alice, "4", "award:y")
    Wallet.objects.filter(account=alice).update(balance=Decimal("5"))
    with pytest.raises(CommandError, match="does not reconcile"):
        call_command("check_kudos")


@pytest.mark.django_db(transaction=True)
def test_concurrent_transfers_between_overlapping_accounts_balance_without_deadlock():
    people = [_account(f"p{i}") for i in range(4)]
    for index, person in enumerate(people):
        _award(person, "100", f"award:{index}")
    errors: list[BaseException] = []

    def move(worker: int) -> None:
        try:
            for n in range(25):
                source, target = people[(worker + n) % 4], people[(worker + n + 1 + n % 2) % 4]
                ledger.transfer(source=source, target=target, amount=Decimal("1.25"), key=f"t:{worker}:{n}")
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=move, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert Event.objects.filter(kind=Event.Kind.TRANSFER).count() == 200
    assert sum(_balance(person) for person in people) == Decimal("400.00")
    assert Posting.objects.total() == 0
    call_command("check_kudos")


@pytest.mark.django_db(transaction=True)
def test_the_same_key_posted_at_once_by_many_threads_moves_kudos_once():
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "10", "award:once")
    barrier = threading.Barrier(6)
    posted: list[bool] = []

    def retry() -> None:
        try:
            barrier.wait()
            posted.append(ledger.transfer(source=alice, target=bob, amount=Decimal(2), key="same")[1])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=retry) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(posted) == [False] * 5 + [True]
    assert (_balance(alice), _balance(bob)) == (Decimal("8.00"), Decimal("2.00"))
    assert connection.vendor == "postgresql"
