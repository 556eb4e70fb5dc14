"""Earning (`kudos.earning`): an accepted submit pays its worker's owner by the AI Horde's text
rate and charges its requester the same, in the submit's own statement; nothing else earns."""

from decimal import Decimal

import pytest
from django.core.management import call_command

from jobs.models import Generation
from jobs.services import abort_stale_generations, cancel_request, submit_generation
from kudos import ledger
from kudos.ledger import to_account, to_system
from kudos.models import Event, Posting, TextModel, Wallet
from tests.conftest import progress, race

T0 = "2026-06-01 08:00:00+00:00"
BRIDGE = {"bridge_agent": "AI Horde Worker:1:https://example.org"}
# 40 tokens of a 13B model from a validated bridge, with a 20-token context:
# 40 x 13 / 125 x (1.2 + 2.2 ^ log2(20 / 1,024)).
EARNED = Decimal("5.04")


def award(caller, amount: str = "1000") -> None:
    ledger.post(
        kind=Event.Kind.AWARD,
        key=f"award:{caller.account.pk}",
        entries=[
            to_system(Wallet.System.TREASURY, -Decimal(amount)),
            to_account(caller.account.pk, Decimal(amount)),
        ],
    )


def _balance(caller, *, escrow: bool = False) -> Decimal:
    return ledger.balance(caller.account.pk, escrow=escrow)


@pytest.fixture
def popped(requester):
    """Queue a 40-token request of the 13B model m1 and pop it as `worker_owner`'s worker."""
    TextModel.objects.create(name="m1", parameters=13_000_000_000)

    def pop(worker_owner) -> str:
        worker_owner.pop("earner", models=["m1"], **BRIDGE)
        requester.request_text(models=["m1"], params={"max_length": 40})
        job = worker_owner.pop("earner", models=["m1"], **BRIDGE).json()
        assert job["id"], job
        return job["id"]

    return pop


def test_an_accepted_submit_pays_the_owner_and_charges_the_requester_at_once(
    requester, trusted_owner, popped
):
    award(requester)
    award(trusted_owner)
    job_id = popped(trusted_owner)
    submitted = trusted_owner.submit(job_id, "y" * 400)
    assert submitted.json()["reward"] == float(EARNED)
    assert _balance(trusted_owner) == Decimal(1000) + EARNED
    assert _balance(requester) == Decimal(1000) - EARNED - 1  # and the horde tax
    event = Event.objects.get(key=f"generation:{job_id}")
    assert (event.kind, Posting.objects.filter(event=event).count()) == (Event.Kind.GENERATION, 4)
    assert Generation.objects.get(pk=job_id).reward == float(EARNED)
    call_command("check_kudos")


def test_an_untrusted_owner_earns_half_into_escrow(requester, owner, popped):
    award(owner)
    job_id = popped(owner)
    owner.submit(job_id, "y" * 400)
    assert (_balance(owner), _balance(owner, escrow=True)) == (Decimal("1002.52"), Decimal("2.52"))


def test_a_censored_result_earns_its_worker_but_costs_its_requester_nothing(requester, trusted_owner, popped):
    award(requester)
    job_id = popped(trusted_owner)
    trusted_owner.submit(job_id, "", state="censored")
    assert _balance(requester) == Decimal(1000) - 1
    assert Generation.objects.get(pk=job_id).reward > 0


def test_a_second_submit_of_a_generation_posts_nothing_more(requester, trusted_owner, popped):
    award(requester)
    job_id = popped(trusted_owner)
    trusted_owner.submit(job_id, "y" * 400)
    again = trusted_owner.submit(job_id, "y" * 400)
    assert again.status_code == 400
    assert Event.objects.filter(kind=Event.Kind.GENERATION).count() == 1
    assert _balance(requester) == Decimal(1000) - EARNED - 1


def test_a_given_back_or_aborted_generation_earns_nothing(requester, trusted_owner, popped, clock):
    award(requester)
    given_back = popped(trusted_owner)
    trusted_owner.submit(given_back, "", state="faulted")
    assert Generation.objects.get(pk=given_back).state == Generation.State.FAULTED
    clock.shift(3600)
    abort_stale_generations()
    assert not Event.objects.filter(kind=Event.Kind.GENERATION).exists()
    assert _balance(trusted_owner) == 0
    call_command("check_kudos")


def test_a_chat_job_cancelled_after_its_output_earns_for_what_it_delivered(requester, owner, chat_job, clock):
    award(requester)
    job = chat_job(owner, max_length=1024)
    clock.shift(5)
    assert progress(owner, job["id"], 1, "forty tokens " * 12, tokens=40).status_code == 200
    generation = Generation.objects.get(pk=job["id"])
    cancel_request(request_id=generation.request_id)
    generation.refresh_from_db()
    assert generation.state == Generation.State.CANCELLED and generation.reward > 0
    event = Event.objects.get(key=f"generation:{job['id']}")
    paid = Posting.objects.filter(event=event, wallet__account=owner.account).total()
    assert paid == Decimal(str(generation.reward))  # half of it in escrow: the owner is untrusted
    assert _balance(requester) == Decimal(1000) - paid - 1
    call_command("check_kudos")


def test_a_job_cancelled_before_any_output_earns_nothing(requester, owner, chat_job):
    job = chat_job(owner, max_length=1024)
    cancel_request(request_id=Generation.objects.get(pk=job["id"]).request_id)
    assert not Event.objects.filter(kind=Event.Kind.GENERATION).exists()


@pytest.mark.django_db(transaction=True)
def test_a_submit_racing_a_cancel_settles_once_or_not_at_all_without_a_deadlock(make_caller):
    requester, owner = make_caller("racer-requester"), make_caller("racer-owner", trusted=True)
    award(requester)
    owner.pop("racer", models=["m1"], **BRIDGE)
    for _ in range(12):  # a cycle, where there is one, shows within a few rounds
        request_id = requester.request_text(models=["m1"], params={"max_length": 40}).json()["id"]
        job_id = owner.pop("racer", models=["m1"], **BRIDGE).json()["id"]
        race(
            lambda job_id=job_id: submit_generation(
                api_key=owner.api_key,
                generation_id=job_id,
                text="y" * 200,
                state="ok",
                seed=0,
                gen_metadata=[],
            ),
            lambda request_id=request_id: cancel_request(request_id=request_id),
        )
        state = Generation.objects.get(pk=job_id).state
        settled = Event.objects.filter(key=f"generation:{job_id}").count()
        # Accepted: settled once. Cancelled first: a legacy worker's submit is answered 0 and its
        # job, which relayed nothing, earns nothing.
        assert (state, settled) in ((Generation.State.DONE, 1), (Generation.State.CANCELLED, 0))
    call_command("check_kudos")
