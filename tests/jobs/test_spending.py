"""Spending (`jobs.spending`): a request's cost held while it is active, the horde tax paid when
it is queued, kudos upfront for large requests, and the queue's priority by kudos."""

from decimal import Decimal

import pytest

from jobs.models import Generation, TextRequest
from jobs.services import cancel_request
from kudos import ledger
from kudos.models import Event
from tests.conftest import give_kudos, race

# 600 tokens of a request naming no model (a 13B model's rate) at 2,048 context:
# 600 x 13 x 3.4 / 100, and the horde tax.
LARGE = {"params": {"max_length": 600, "max_context_length": 2048}}
LARGE_COST = Decimal("265.20")


def _balance(caller) -> Decimal:
    return ledger.balance(caller.account.pk)


def test_a_large_request_from_an_account_that_cannot_cover_it_is_refused_upfront(requester):
    refused = requester.request_text(**LARGE)
    assert (refused.status_code, refused.json()["rc"]) == (403, "KudosUpfront")
    assert "over 512 tokens" in refused.json()["message"]
    assert not TextRequest.objects.exists() and not Event.objects.exists()


def test_a_request_that_allows_a_downgrade_is_queued_with_fewer_tokens(requester):
    queued = requester.request_text(**LARGE, allow_downgrade=True)
    assert queued.status_code == 202, queued.content
    request = TextRequest.objects.get()
    assert (request.max_length, request.params["max_length"], request.slow_workers) == (512, 512, True)


def test_a_request_refusing_slow_workers_needs_its_kudos_upfront_however_short(requester):
    refused = requester.request_text(params={"max_length": 16}, slow_workers=False)
    assert refused.json()["rc"] == "KudosUpfront"
    give_kudos(requester, "100")
    assert requester.request_text(params={"max_length": 16}, slow_workers=False).status_code == 202


def test_queueing_holds_the_cost_and_pays_the_horde_tax_and_a_dry_run_neither(requester):
    give_kudos(requester, "1000")
    dry = requester.request_text(**LARGE, dry_run=True)
    assert dry.json() == {"kudos": 266}  # 265.2 and the tax, whole
    assert _balance(requester) == Decimal(1000)
    queued = requester.request_text(**LARGE)
    assert queued.json()["kudos"] == 266
    request = TextRequest.objects.get()
    assert (request.kudos_reserved, _balance(requester)) == (LARGE_COST, Decimal(999))
    assert Event.objects.get(key=f"tax:{request.pk}").kind == Event.Kind.TAX


def test_what_a_request_holds_is_released_when_it_ends(requester):
    # 25 (the floor) + 300 covers one large request (265.2 held and 1 paid), not two.
    give_kudos(requester, "325")
    first = requester.request_text(**LARGE).json()["id"]
    assert requester.request_text(**LARGE).json()["rc"] == "KudosUpfront"
    cancel_request(request_id=first)
    assert requester.request_text(**LARGE).status_code == 202


def test_a_generation_charged_counts_against_what_its_request_holds(requester, trusted_owner):
    give_kudos(requester, "1000")
    trusted_owner.pop("w", models=["m1"])
    request_id = requester.request_text(**LARGE).json()["id"]
    job = trusted_owner.pop("w", models=["m1"], max_length=1024).json()
    trusted_owner.submit(job["id"], "y" * 400)
    request = TextRequest.objects.get(pk=request_id)
    assert request.kudos_spent == Decimal(str(Generation.objects.get(pk=job["id"]).reward)) > 0
    assert _balance(requester) == Decimal(999) - request.kudos_spent


def test_an_account_with_more_kudos_goes_first_among_accounts_with_as_many_running(
    make_caller, owner, time_machine
):
    time_machine.move_to("2026-07-01 00:00:00+00:00", tick=False)
    poor, rich = make_caller("poor"), make_caller("rich")
    give_kudos(rich, "5000")
    owner.pop("w", models=["m1"])
    poor.request_text(models=["m1"])
    time_machine.shift(1)
    rich.request_text(models=["m1"])
    first = Generation.objects.get(pk=owner.pop("w", models=["m1"]).json()["id"])
    assert (first.request.account, first.request.priority) == (rich.account, 5000)
    # Fairness first: the rich account's second request waits behind the poor one's first.
    rich.request_text(models=["m1"])
    second = Generation.objects.get(pk=owner.pop("w", models=["m1"]).json()["id"])
    assert second.request.account == poor.account


@pytest.mark.django_db(transaction=True)
def test_two_upfront_requests_at_once_against_one_balance_admit_one(make_caller):
    requester = make_caller("payer")
    give_kudos(requester, "325")
    answers = race(*[lambda: requester.request_text(**LARGE).status_code] * 2)
    assert sorted(answers) == [202, 403]
    assert _balance(requester) == Decimal(324)
