"""The kudos ledger (`kudos.ledger`): balanced, append-only events, each business key posted
once, the floor's forgiveness posted as minted, and balances that match their postings, under
concurrent posting too."""

from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction

from kudos import ledger
from kudos.ledger import to_account, to_system
from kudos.models import Event, Posting, Wallet
from tests.conftest import race
from workers.models import ANONYMOUS_API_KEY_HASH, Account
from workers.services import create_account

TREASURY, SINK = Wallet.System.TREASURY, Wallet.System.SINK


def _account(name: str) -> Account:
    account, _ = create_account(name=name)
    return account


def _balance(account: Account, *, escrow: bool = False) -> Decimal:
    return ledger.balance(account.pk, escrow=escrow)


def _award(account: Account, amount: str, key: str, *, escrow: bool = False) -> ledger.Posted:
    return ledger.post(
        kind=Event.Kind.AWARD,
        key=key,
        entries=[
            to_system(TREASURY, -Decimal(amount)),
            to_account(account.pk, Decimal(amount), escrow=escrow),
        ],
    )


def _move(source: Account, target: Account, amount: str, key: str) -> ledger.Posted:
    return ledger.post(
        kind=Event.Kind.TRANSFER,
        key=key,
        entries=[to_account(source.pk, -Decimal(amount)), to_account(target.pk, Decimal(amount))],
    )


def test_an_award_is_minted_by_the_treasury_and_the_ledger_sums_to_zero(db):
    alice = _account("alice")
    posted = _award(alice, "112.50", "award:1")
    assert posted.posted and _balance(alice) == Decimal("112.50")
    assert Posting.objects.total() == 0
    assert Posting.objects.filter(wallet__system=TREASURY).total() == Decimal("-112.50")
    call_command("check_kudos")


def test_a_retried_event_posts_nothing_twice(db):
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "100", "award:a")
    _award(bob, "100", "award:b")
    first = _move(alice, bob, "3", "transfer:k1")
    again = _move(alice, bob, "3", "transfer:k1")
    assert (first.posted, again.posted, first.event_id) == (True, False, again.event_id)
    assert (_balance(alice), _balance(bob)) == (Decimal("97.00"), Decimal("103.00"))


def test_each_account_keeps_its_kudos_details_by_the_ai_hordes_actions(db):
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "100", "award:da")
    _award(bob, "100", "award:db")
    _move(alice, bob, "3", "transfer:d")
    details = dict(Wallet.objects.filter(account__isnull=False).values_list("account__name", "details"))
    assert {name: {k: Decimal(str(v)) for k, v in d.items()} for name, d in details.items()} == {
        "alice": {"awarded": 100, "gifted": -3},
        "bob": {"awarded": 100, "received": 3},
    }
    call_command("check_kudos")
    Wallet.objects.filter(account=bob).update(details={"awarded": 100, "received": 4})
    with pytest.raises(CommandError, match="does not reconcile"):
        call_command("check_kudos")


def test_an_events_records_are_kept_by_account_and_checked_against_the_events(db):
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "100", "award:ra")
    for key in ("generation:1", "generation:2"):
        ledger.post(
            kind=Event.Kind.GENERATION,
            key=key,
            entries=[to_account(alice.pk, Decimal("-2")), to_account(bob.pk, Decimal("2"))],
            records={alice.pk: {"usage_tokens": 30, "request_text": 1}, bob.pk: {"fulfillment_text": 1}},
        )
    kept = dict(Wallet.objects.filter(account__isnull=False).values_list("account__name", "details"))
    assert (kept["alice"]["usage_tokens"], kept["alice"]["request_text"]) == (60, 2)
    assert kept["bob"]["fulfillment_text"] == 2
    call_command("check_kudos")
    Wallet.objects.filter(account=alice).update(details={**kept["alice"], "usage_tokens": 61})
    with pytest.raises(CommandError, match="does not reconcile"):
        call_command("check_kudos")


def test_a_debit_past_the_floor_is_forgiven_and_posted_as_minted(db):
    alice = _account("alice")
    _award(alice, "30", "award:f")
    spent = ledger.post(
        kind=Event.Kind.SPEND,
        key="spend:1",
        entries=[to_account(alice.pk, Decimal(-12)), to_system(SINK, Decimal(12))],
    )
    # 30 - 12 is below a registered account's floor of 25: the 7 below it are forgiven.
    assert (_balance(alice), spent.forgiven) == (Decimal("25.00"), Decimal("7.00"))
    floor = Event.objects.get(key="spend:1:floor")
    assert floor.kind == Event.Kind.FORGIVEN
    assert sorted(floor.postings.values_list("amount", flat=True)) == [Decimal("-7.00"), Decimal("7.00")]
    assert Posting.objects.total() == 0
    call_command("check_kudos")


def test_the_anonymous_account_may_go_down_to_minus_fifty_and_an_escrow_has_no_floor(db):
    anonymous, _ = Account.objects.get_or_create(
        api_key_hash=ANONYMOUS_API_KEY_HASH, defaults={"name": "Anonymous"}
    )
    alice = _account("alice")
    ledger.post(
        kind=Event.Kind.SPEND,
        key="spend:anon",
        entries=[to_account(anonymous.pk, Decimal(-80)), to_system(SINK, Decimal(80))],
    )
    _award(alice, "3", "award:escrow", escrow=True)
    assert _balance(anonymous) == Decimal("-50.00")
    assert (_balance(alice, escrow=True), _balance(alice)) == (Decimal("3.00"), Decimal("0.00"))
    call_command("check_kudos")


def test_entries_that_do_not_sum_to_zero_are_refused_before_and_at_commit(transactional_db):
    alice = _account("alice")
    with pytest.raises(ledger.Unbalanced):
        ledger.post(kind=Event.Kind.AWARD, key="bad", entries=[to_account(alice.pk, Decimal(5))])
    _award(alice, "30", "award:w")
    wallet = Wallet.objects.get(account=alice, escrow=False)
    # Past the service, the database itself refuses an unbalanced event when it commits.
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            event = Event.objects.create(kind=Event.Kind.AWARD, key="forged")
            Posting.objects.create(event=event, wallet=wallet, amount=Decimal(5))
    assert not Event.objects.filter(key="forged").exists()


def test_postings_and_events_are_never_updated_or_deleted(db):
    alice = _account("alice")
    event_id = _award(alice, "1", "award:x").event_id
    for change in (
        lambda: Posting.objects.filter(event_id=event_id).update(amount=Decimal(2)),
        lambda: Posting.objects.filter(event_id=event_id).delete(),
        lambda: Event.objects.filter(pk=event_id).update(reason="rewritten"),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            change()


def test_check_kudos_fails_on_a_balance_that_drifted_from_its_postings(db):
    alice = _account("alice")
    _award(alice, "40", "award:y")
    Wallet.objects.filter(account=alice).update(balance=Decimal("41"))
    with pytest.raises(CommandError, match="does not reconcile"):
        call_command("check_kudos")


@pytest.mark.django_db(transaction=True)
def test_concurrent_transfers_between_overlapping_accounts_balance_without_deadlock():
    people = [_account(f"p{i}") for i in range(4)]
    for index, person in enumerate(people):
        _award(person, "100", f"award:{index}")

    def move(worker: int) -> None:
        for n in range(25):
            source, target = people[(worker + n) % 4], people[(worker + n + 1 + n % 2) % 4]
            _move(source, target, "1.25", f"t:{worker}:{n}")

    race(*[lambda worker=worker: move(worker) for worker in range(8)])
    assert Event.objects.filter(kind=Event.Kind.TRANSFER).count() == 200
    assert sum(_balance(person) for person in people) == Decimal("400.00")
    assert Posting.objects.total() == 0
    call_command("check_kudos")


@pytest.mark.django_db(transaction=True)
def test_the_same_key_posted_at_once_by_many_threads_moves_kudos_once():
    alice, bob = _account("alice"), _account("bob")
    _award(alice, "100", "award:once")
    _award(bob, "100", "award:once-b")
    posted = race(*[lambda: _move(alice, bob, "2", "same").posted] * 6)
    assert sorted(posted) == [False] * 5 + [True]
    assert (_balance(alice), _balance(bob)) == (Decimal("98.00"), Decimal("102.00"))
    assert connection.vendor == "postgresql"
