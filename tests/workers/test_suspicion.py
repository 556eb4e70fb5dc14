"""Suspicion (workers/suspicion.py): speed beyond the model's size, maintenance cycling and
give-backs, each recorded with its reason; SUSPICION_THRESHOLD of them flag the account, whose
workers are then offered nothing."""

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from kudos.models import TextModel
from workers import suspicion
from workers.models import Account, Suspicion, Worker
from workers.services import count_aborts

T0 = "2026-07-01 12:00:00+00:00"
MODEL = "koboldcpp/Big-Model-13B"


@pytest.fixture
def sized(db):
    TextModel.objects.create(name=MODEL, parameters=13_000_000_000)
    TextModel.objects.create(name="koboldcpp/Huge-70B", parameters=70_000_000_000)
    TextModel.objects.create(name="koboldcpp/Mix-8x7B", parameters=46_000_000_000)


def _serve(owner, requester, clock, *, seconds: float, chars: int, model: str = MODEL, name: str = "w"):
    """One job of `model`: popped, then `chars` characters submitted `seconds` later."""
    assert requester.request_text(models=[model], params={"max_length": 512}).status_code == 202
    job = owner.pop(name, models=[model], max_length=512).json()
    assert job.get("id") is not None, job
    clock.shift(seconds)
    assert owner.submit(job["id"], "x" * chars).status_code == 200
    clock.shift(1)


def test_the_ceilings_follow_the_model_size_as_the_ai_hordes_do():
    assert suspicion.speed_ceiling("any", None) is None
    assert suspicion.speed_ceiling("a-70B", 70) == 30
    assert suspicion.speed_ceiling("a-13B", 13) == 150
    assert suspicion.speed_ceiling("a-14B", 14) == 100
    assert suspicion.speed_ceiling("a-3B", 3) == 150
    assert suspicion.speed_ceiling("Mix-8x7B", 46) == 300


def test_an_untrusted_worker_faster_than_its_models_size_allows_is_suspected_and_five_flag_it(
    clock, sized, owner, requester, settings
):
    _serve(owner, requester, clock, seconds=10, chars=2000)  # 500 tokens in 10 s: 50 t/s
    assert not Suspicion.objects.exists()
    _serve(owner, requester, clock, seconds=1, chars=2000)  # 500 t/s for a 13B model: beyond 150
    [first] = Suspicion.objects.all()
    assert (first.reason, first.detail) == ("unreasonably_fast", f"500 t/s > 150 t/s for {MODEL}")
    assert first.worker == Worker.objects.get(name="w")
    assert Account.objects.get(pk=owner.account.pk).flagged_at is None

    for _ in range(settings.SUSPICION_THRESHOLD - 1):
        _serve(owner, requester, clock, seconds=1, chars=2000)
    assert Suspicion.objects.filter(account=owner.account).count() == settings.SUSPICION_THRESHOLD
    assert Account.objects.get(pk=owner.account.pk).flagged_at is not None

    # Flagged: its workers, the old and any new one, are offered nothing.
    requester.request_text(models=[MODEL])
    assert owner.pop("w", models=[MODEL]).json()["id"] is None
    assert owner.pop("another", models=[MODEL]).json()["id"] is None
    suspicion.clear(accounts=Account.objects.filter(pk=owner.account.pk))
    assert not Suspicion.objects.exists()
    assert owner.pop("w", models=[MODEL]).json()["id"] is not None


def test_trusted_workers_short_replies_and_models_of_unknown_size_are_not_suspected(
    clock, sized, owner, trusted_owner, requester
):
    _serve(trusted_owner, requester, clock, seconds=1, chars=2000, name="trusted-w")
    _serve(owner, requester, clock, seconds=0.1, chars=200)  # 50 tokens at once: too short to judge
    _serve(owner, requester, clock, seconds=1, chars=2000, model="unknown-model")
    _serve(owner, requester, clock, seconds=4, chars=2000, model="koboldcpp/Mix-8x7B", name="w2")  # 125 < 300
    assert not Suspicion.objects.exists()
    _serve(owner, requester, clock, seconds=4, chars=2000, model="koboldcpp/Huge-70B", name="w3")  # 125 > 30
    assert Suspicion.objects.get().detail == "125 t/s > 30 t/s for koboldcpp/Huge-70B"


def test_each_trip_into_maintenance_by_aborts_is_a_suspicion(clock, owner, settings):
    owner.pop("cycling")
    worker = Worker.objects.get(name="cycling")
    threshold = settings.WORKER_ABORT_MAINTENANCE_THRESHOLD
    count_aborts(counts=Counter({worker.pk: threshold}), now=timezone.now())
    assert not Suspicion.objects.exists()  # at the threshold, not past it
    for trip in range(1, 3):
        Worker.objects.filter(pk=worker.pk).update(maintenance=False)  # its owner lifted it
        count_aborts(counts=Counter({worker.pk: threshold + 1}), now=timezone.now())
        assert Worker.objects.get(pk=worker.pk).maintenance
        assert Suspicion.objects.filter(reason="aborts").count() == trip
        clock.shift(timedelta(hours=1, seconds=1))
    assert "more than 20 aborts within an hour" in Suspicion.objects.first().detail


def test_a_worker_that_gives_back_most_of_its_jobs_is_suspected_and_its_give_backs_counted(
    clock, owner, requester
):
    for n in range(suspicion.GIVE_BACK_MIN):
        requester.request_text(prompt=f"p{n}")
        job = owner.pop("giver").json()
        assert owner.submit(job["id"], "", state="faulted").status_code == 200
        clock.shift(1)
    worker = Worker.objects.get(name="giver")
    assert (worker.given_back, worker.uncompleted_jobs, worker.maintenance) == (10, 10, False)
    [given] = Suspicion.objects.all()
    assert (given.reason, given.detail) == ("give_backs", "gave back 10 of the 10 jobs it took")
    assert suspicion.gives_back_too_much(given_back=20, completed=21) is False
    assert suspicion.gives_back_too_much(given_back=20, completed=20) is True
    assert suspicion.gives_back_too_much(given_back=15, completed=0) is False
