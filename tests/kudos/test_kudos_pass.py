"""The kudos pass (`kudos.passes`): uptime paid for each 600 s a worker stays online, and
evaluation escrow released when its account is, or becomes, trusted."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from kudos import ledger
from kudos.models import Event, TextModel
from kudos.passes import run_kudos_pass
from workers.models import Account, Worker

T0 = "2026-06-01 08:00:00+00:00"
BRIDGE = {"bridge_agent": "AI Horde Worker:1:https://example.org"}
# A 13B model at 2,048 tokens of context: (25 + 15 x 2,048 / 1,024) x 13 / 7.
UPTIME = Decimal("102.14")


@pytest.fixture
def online(clock):
    """Keep a worker of `caller` online (a pop a minute) for `seconds`, running the pass each minute."""
    TextModel.objects.get_or_create(name="m13", defaults={"parameters": 13_000_000_000})

    def keep(caller, seconds: int, name: str = "up", context: int = 2048) -> None:
        for _ in range(seconds // 60):
            caller.pop(name, models=["m13"], max_context_length=context, **BRIDGE)
            run_kudos_pass()
            clock.shift(60)

    return keep


def test_a_worker_online_for_ten_minutes_earns_its_owner_one_uptime_reward(trusted_owner, online):
    online(trusted_owner, 11 * 60)
    assert Event.objects.filter(kind=Event.Kind.UPTIME).count() == 1
    assert ledger.balance(trusted_owner.account.pk) == UPTIME
    worker = Worker.objects.get()
    assert worker.kudos_uptime == float(UPTIME)
    details = trusted_owner.client.get(f"/api/v2/workers/{worker.pk}").json()
    # The AI Horde's WorkerKudosDetails declares `uptime` an integer; the total keeps the fraction.
    assert details["kudos_details"]["uptime"] == 102 and details["kudos_rewards"] == float(UPTIME)
    call_command("check_kudos")


def test_a_worker_that_went_offline_is_counted_anew(trusted_owner, online, clock, settings):
    online(trusted_owner, 5 * 60)
    clock.shift(settings.WORKER_ONLINE_SECONDS + 60)
    run_kudos_pass()  # offline: not counted
    online(trusted_owner, 7 * 60)
    assert not Event.objects.filter(kind=Event.Kind.UPTIME).exists()
    online(trusted_owner, 5 * 60)
    assert Event.objects.filter(kind=Event.Kind.UPTIME).count() == 1


def test_an_untrusted_owners_uptime_goes_to_escrow(owner, online):
    online(owner, 11 * 60)
    pk = owner.account.pk
    assert (ledger.balance(pk), ledger.balance(pk, escrow=True)) == (0, UPTIME)


def test_escrow_past_the_threshold_makes_an_old_enough_account_trusted(owner, online, clock, settings):
    settings.KUDOS_TRUST_THRESHOLD = 150
    online(owner, 21 * 60)  # two periods: 204.28 in escrow, but the account is new
    pk = owner.account.pk
    assert not Account.objects.get(pk=pk).trusted
    Account.objects.filter(pk=pk).update(created_at=timezone.now() - timedelta(days=8))
    run_kudos_pass()
    assert Account.objects.get(pk=pk).trusted
    assert (ledger.balance(pk), ledger.balance(pk, escrow=True)) == (2 * UPTIME, 0)
    assert Event.objects.filter(kind=Event.Kind.PROMOTION).count() == 1
    call_command("check_kudos")


def test_a_flagged_account_is_never_trusted_by_its_escrow_until_a_moderator_clears_it(
    owner, online, clock, settings
):
    from workers import suspicion

    settings.KUDOS_TRUST_THRESHOLD = 150
    online(owner, 21 * 60)
    pk = owner.account.pk
    Account.objects.filter(pk=pk).update(
        created_at=timezone.now() - timedelta(days=8), flagged_at=timezone.now()
    )
    run_kudos_pass()
    assert not Account.objects.get(pk=pk).trusted
    assert ledger.balance(pk, escrow=True) == 2 * UPTIME
    suspicion.clear(accounts=Account.objects.filter(pk=pk))
    run_kudos_pass()
    assert Account.objects.get(pk=pk).trusted


def test_without_a_threshold_no_account_becomes_trusted_but_a_moderators_trust_releases_escrow(
    owner, online, clock, settings
):
    settings.KUDOS_TRUST_THRESHOLD = None
    online(owner, 11 * 60)
    pk = owner.account.pk
    Account.objects.filter(pk=pk).update(created_at=timezone.now() - timedelta(days=30))
    run_kudos_pass()
    assert not Account.objects.get(pk=pk).trusted
    Account.objects.filter(pk=pk).update(trusted=True)  # as a moderator does in the admin
    run_kudos_pass()
    assert (ledger.balance(pk), ledger.balance(pk, escrow=True)) == (UPTIME, 0)


@pytest.mark.parametrize("hold", ["paused", "flagged"])
def test_a_paused_worker_or_one_of_a_flagged_account_earns_no_uptime(owner, online, hold):
    online(owner, 60)
    if hold == "paused":
        Worker.objects.update(paused=True)
    else:
        Account.objects.filter(pk=owner.account.pk).update(flagged_at=timezone.now())
    online(owner, 21 * 60)
    assert not Event.objects.filter(kind=Event.Kind.UPTIME).exists()
    assert Worker.objects.get().kudos_uptime == 0


def test_uptime_counts_no_more_context_than_the_worker_has_shown_it_serves(
    trusted_owner, requester, online, clock
):
    # Declaring a million tokens of context earns an idle worker the pop's default 2,048.
    online(trusted_owner, 11 * 60, context=1_048_576)
    assert Worker.objects.get().kudos_uptime == float(UPTIME)
    # A job of 8,000 prompt tokens (32,000 characters) and a 20-token reply shows 8,020.
    requester.request_text("word" * 8000, models=["m13"], params={"max_context_length": 8192})
    job = trusted_owner.pop("up", models=["m13"], max_context_length=1_048_576, **BRIDGE).json()
    assert trusted_owner.submit(job["id"]).status_code == 200
    assert Worker.objects.get().served_context == 8020
    online(trusted_owner, 10 * 60, context=1_048_576)
    # (25 + 15 x 8,020 / 1,024) x 13 / 7 for the second period.
    assert Worker.objects.get().kudos_uptime == float(UPTIME + Decimal("264.61"))
    call_command("check_kudos")
