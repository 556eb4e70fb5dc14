"""POST /api/v2/kudos/transfer (`kudos.transfers`): kudos sent from what an account can spend,
once per Idempotency-Key, within the AI Horde's limits."""

import functools
import threading
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connections, transaction

from front.moderation import suspend_accounts
from hordeops import clock as hclock
from hordeops import errors
from kudos import ledger
from kudos.models import Event
from kudos.transfers import transfer_kudos
from tests.conftest import give_kudos, race
from workers.models import Account

T0 = "2026-06-01 08:00:00+00:00"


def _send(caller, username: str, amount=10, key: str | None = None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return caller.post("/api/v2/kudos/transfer", {"username": username, "amount": amount}, **headers)


def _alias(caller) -> str:
    return f"{caller.account.name}#{caller.account.pk}"


def _balance(caller) -> Decimal:
    return ledger.balance(caller.account.pk)


def test_a_transfer_moves_kudos_and_a_retry_with_its_key_moves_nothing_more(requester, owner, clock):
    give_kudos(requester, "100")
    give_kudos(owner, "100")
    sent = _send(requester, _alias(owner), 30, key="k-1")
    assert (sent.status_code, sent.json()) == (200, {"transferred": 30})
    clock.shift(2)
    again = _send(requester, _alias(owner), 30, key="k-1")
    assert again.json() == {"transferred": 30}
    assert (_balance(requester), _balance(owner)) == (Decimal(70), Decimal(130))
    found = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).json()
    assert (found["kudos"], found["kudos_details"]["gifted"]) == (70, -30)
    clock.shift(2)
    conflict = _send(requester, _alias(owner), 31, key="k-1")
    assert (conflict.status_code, conflict.json()["rc"]) == (400, "IdempotencyKeyConflict")
    call_command("check_kudos")


def test_a_transfer_is_refused_past_what_its_sender_can_spend(requester, owner, clock):
    give_kudos(requester, "100")
    # 100 less the floor of 25 can be spent, less what a queued request holds (13 x 80 x 3.4 / 100).
    requester.request_text(params={"max_length": 80})
    clock.shift(2)
    refused = _send(requester, _alias(owner), 40)
    assert (refused.status_code, refused.json()["rc"]) == (400, "KudosTransferNotEnough")
    clock.shift(2)
    assert _send(requester, _alias(owner), 38).status_code == 200


@pytest.mark.parametrize(
    ("to", "amount", "rc"),
    [
        ("nobody#999999", 10, "InvalidTargetUsername"),
        ("not-a-user", 10, "InvalidTargetUsername"),
        ("self", 10, "KudosTransferToSelf"),
        ("anonymous", 10, "KudosTransferToAnon"),
        ("owner", 0, "InvalidKudosTransferAmount"),
        ("owner", -5, "NegativeKudosTransfer"),
    ],
)
def test_the_ai_hordes_refusals(requester, owner, anonymous, to, amount, rc):
    give_kudos(requester, "100")
    username = {"self": _alias(requester), "anonymous": _alias(anonymous), "owner": _alias(owner)}.get(to, to)
    refused = _send(requester, username, amount)
    assert (refused.status_code, refused.json()["rc"]) == (400, rc)
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()


def test_the_anonymous_account_sends_nothing(anonymous, owner):
    refused = _send(anonymous, _alias(owner))
    assert refused.json()["rc"] == "KudosTransferFromAnon"


def test_kudos_cannot_go_straight_back_within_a_minute(requester, owner, clock):
    give_kudos(requester, "100")
    give_kudos(owner, "100")
    assert _send(requester, _alias(owner), 5).status_code == 200
    back = _send(owner, _alias(requester), 5)
    assert back.json()["rc"] == "TooFastKudosTransfers"
    clock.shift(61)
    assert _send(owner, _alias(requester), 5).status_code == 200


def test_one_key_sends_one_transfer_a_second(requester, owner, make_caller, clock):
    give_kudos(requester, "100")
    third = make_caller("third")
    assert _send(requester, _alias(owner), 1).status_code == 200
    limited = _send(requester, _alias(third), 1)
    assert (limited.status_code, limited.json()["rc"]) == (429, "RateLimited")
    clock.shift(1.1)
    assert _send(requester, _alias(third), 1).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_transfer_retried_at_once_moves_once_and_two_past_the_balance_move_one(make_caller):
    sender, receiver, other = make_caller("sender"), make_caller("receiver"), make_caller("other")
    give_kudos(sender, "85")  # 60 can be spent: one transfer of 40, not two

    def send(to, key: str) -> object:
        try:
            return transfer_kudos(source=sender.account, username=_alias(to), amount=40, idempotency_key=key)
        except errors.KudosValidationError as exc:
            return exc.code

    answers = race(
        lambda: send(receiver, "same"), lambda: send(receiver, "same"), lambda: send(other, "other")
    )
    assert Event.objects.filter(kind=Event.Kind.TRANSFER).count() == 1, answers
    # Whichever went first: the keyed transfer (its retry answers the same) or the other.
    refused = "KudosTransferNotEnough"
    assert sorted(map(str, answers)) in (["40", "40", refused], ["40", refused, refused])
    assert _balance(sender) == Decimal(45)
    call_command("check_kudos")


def test_a_fractional_amount_is_refused_and_a_whole_float_moves_what_it_says(requester, owner, clock):
    give_kudos(requester, "100")
    refused = _send(requester, _alias(owner), 1.5)
    assert (refused.status_code, refused.json()["rc"]) == (400, "ValidationError")
    assert refused.json()["errors"] == {"amount": "A whole number of kudos is required."}
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()
    sent = _send(requester, _alias(owner), 7.0)  # horde_sdk sends floats
    assert sent.json() == {"transferred": 7}
    clock.shift(2)
    assert _send(requester, _alias(owner), "7").json()["rc"] == "ValidationError"


@pytest.mark.django_db(transaction=True)
def test_a_sender_locked_for_a_transfer_does_not_block_an_event_that_opens_its_escrow(make_caller):
    """A transfer or a queueing locks its payer's account row; an event that creates one of its
    wallets checks that row's key. The lock must let that check through, or a submit holding
    another wallet and a transfer waiting for that wallet deadlock."""
    from kudos.sql import LOCK_ACCOUNT

    sender, other = make_caller("sender"), make_caller("other")
    give_kudos(other, "10")
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(LOCK_ACCOUNT, {"account_id": sender.account.pk})
        posted = {}

        def opens_escrow() -> None:
            try:
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET lock_timeout = '2s'")
                posted["event"] = ledger.post(
                    kind=Event.Kind.GENERATION,
                    key="generation:escrow-opened",
                    entries=[
                        ledger.to_account(other.account.pk, Decimal("-2")),
                        ledger.to_account(sender.account.pk, Decimal("2"), escrow=True),
                    ],
                )
            except Exception as exc:  # the lock timeout, had the row lock blocked it
                posted["error"] = exc
            finally:
                connections.close_all()

        thread = threading.Thread(target=opens_escrow)
        thread.start()
        thread.join(timeout=10)
        holder.rollback()
    finally:
        holder.close()
    assert "error" not in posted and posted["event"].posted
    assert ledger.balance(sender.account.pk, escrow=True) == Decimal("2.00")


def test_a_key_ending_in_floor_sends_its_transfer_and_names_no_floor_event(
    requester, owner, make_caller, clock
):
    give_kudos(requester, "100")
    # A new receiver's first kudos are raised to its floor: the ledger posts a floor event too.
    assert _send(requester, _alias(owner), 5, key="k").status_code == 200
    assert Event.objects.filter(kind=Event.Kind.FORGIVEN).exists()
    clock.shift(2)
    sent = _send(requester, _alias(make_caller("third")), 5, key="k:floor")
    assert (sent.status_code, sent.json()) == (200, {"transferred": 5})
    assert Event.objects.filter(kind=Event.Kind.TRANSFER).count() == 2
    call_command("check_kudos")


@pytest.mark.parametrize("key", ["a" * 129, "a" * 200, "two words", "caf\u00e9", "a\tb"])
def test_a_key_outside_its_characters_or_length_is_refused_before_a_rate_token_is_spent(
    requester, owner, key
):
    give_kudos(requester, "100")
    refused = _send(requester, _alias(owner), 5, key=key)
    assert refused.status_code == 400
    assert refused.json() == {
        "message": "Idempotency-Key must be 1 to 128 characters of letters, digits and . _ ~ + / = : -",
        "rc": "InvalidIdempotencyKey",
    }
    # The key's one transfer a second was not spent on the refusal.
    assert _send(requester, _alias(owner), 5, key="a" * 128).status_code == 200


def test_a_transfer_to_a_suspended_account_is_refused_as_one_to_a_deleted_account(requester, owner, clock):
    give_kudos(requester, "100")
    suspend_accounts(
        accounts=Account.objects.filter(pk=owner.account.pk), reason="Seen flooding.", now=hclock.now()
    )
    refused = _send(requester, _alias(owner), 5)
    assert (refused.status_code, refused.json()) == (
        400,
        {"message": "Invalid target username.", "rc": "InvalidTargetUsername"},
    )
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()


@pytest.mark.django_db(transaction=True)
def test_two_accounts_sending_to_each_other_at_once_move_kudos_one_way_only(make_caller):
    for round_ in range(3):  # three pairs: each race must leave one transfer
        a, b = make_caller(f"a{round_}"), make_caller(f"b{round_}")
        give_kudos(a, "100")
        give_kudos(b, "100")

        def send(source, to) -> object:
            try:
                return transfer_kudos(source=source.account, username=_alias(to), amount=5)
            except errors.KudosValidationError as exc:
                return exc.code

        answers = race(functools.partial(send, a, b), functools.partial(send, b, a))
        assert sorted(map(str, answers)) == ["5", "TooFastKudosTransfers"], answers
    assert Event.objects.filter(kind=Event.Kind.TRANSFER).count() == 3
    call_command("check_kudos")


def test_a_flagged_account_can_neither_send_nor_receive_kudos(requester, owner, clock):
    give_kudos(requester, "100")
    Account.objects.filter(pk=requester.account.pk).update(flagged_at=hclock.now())
    refused = _send(requester, _alias(owner), 5)
    assert (refused.status_code, refused.json()) == (
        400,
        {
            "message": "Your account has been flagged for suspicious activity. Please contact the mods.",
            "rc": "SourceAccountFlagged",
        },
    )
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()
    # Nor receive: the AI Horde refuses a transfer to a flagged account too.
    give_kudos(owner, "100")
    refused = _send(owner, _alias(requester), 5)
    assert (refused.status_code, refused.json()["rc"]) == (400, "TargetAccountFlagged")
    assert "target account has been flagged" in refused.json()["message"]
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()


class _RolledBack(Exception):
    pass


def test_a_transfer_rolled_back_leaves_no_guard_against_the_transfer_back(requester, owner, clock):
    give_kudos(requester, "100")
    give_kudos(owner, "100")
    with pytest.raises(_RolledBack), transaction.atomic():
        transfer_kudos(source=requester.account, username=_alias(owner), amount=5)
        raise _RolledBack  # the caller's transaction fails after the transfer's own
    assert not Event.objects.filter(kind=Event.Kind.TRANSFER).exists()
    assert _send(owner, _alias(requester), 5).status_code == 200


def test_the_guard_is_the_committed_transfer_and_ends_a_minute_after_it(requester, owner, clock):
    give_kudos(requester, "100")
    give_kudos(owner, "100")
    assert transfer_kudos(source=requester.account, username=_alias(owner), amount=5) == 5
    clock.shift(59)
    with pytest.raises(errors.KudosValidationError) as refused:
        transfer_kudos(source=owner.account, username=_alias(requester), amount=5)
    assert refused.value.code == "TooFastKudosTransfers"
    clock.shift(2)
    assert transfer_kudos(source=owner.account, username=_alias(requester), amount=5) == 5
