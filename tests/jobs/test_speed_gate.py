"""The speed gate as a preference (docs/reference/worker_protocol.md), and its records."""

from datetime import timedelta

import pytest
from django.utils import timezone

from hordeops import metrics
from jobs.models import Generation, TextRequest
from jobs.services import abort_stale_generations
from tests.conftest import give_kudos, queue_chat
from workers.models import Worker

DECLARED = {"models": ["chat-model"], "chat": True, "max_length": 16384, "max_context_length": 32768}


def _worker(caller, name: str, speed: float | None) -> None:
    assert caller.pop(name, **DECLARED).status_code == 200
    Worker.objects.filter(name=name).update(speed=speed)


def _pop(caller, name: str) -> Generation | None:
    job = caller.pop(name, **DECLARED).json()
    return Generation.objects.get(pk=job["id"]) if job["id"] else None


def _status(requester, text_request: TextRequest) -> dict:
    return requester.status(str(text_request.id)).json()


@pytest.mark.parametrize(
    ("speed", "longest"),
    [(None, 1200), (10, 1200), (40, 4800), (2.5, 300)],
)
def test_a_worker_is_offered_chat_jobs_up_to_its_capacity_while_faster_ones_are_online(
    requester, owner, trusted_owner, speed, longest
):
    _worker(trusted_owner, "very-fast", 1000)  # capable of anything: the fallback never applies
    _worker(owner, "gauged", speed)
    fits, too_long = queue_chat(requester, longest), queue_chat(requester, longest + 1)
    generation = _pop(owner, "gauged")
    assert generation is not None and generation.request_id == fits.id
    assert (generation.fallback_tier, generation.capacity_at_pop) == (1, longest)
    assert _pop(owner, "gauged") is None  # the longer job waits for the capable worker
    assert _pop(trusted_owner, "very-fast").request_id == too_long.id


def test_a_slower_worker_gets_the_job_when_no_capable_worker_is_online(requester, owner, trusted_owner):
    _worker(trusted_owner, "fast", 40)
    _worker(owner, "slow", 10)
    Worker.objects.filter(name="fast").update(last_pop_at=timezone.now() - timedelta(seconds=301))
    job = queue_chat(requester, 1500)
    generation = _pop(owner, "slow")
    assert generation is not None and generation.request_id == job.id
    # 10 tokens/s x (200 s untrusted cap - 30 s) = 1700 >= 1500: over capacity, within its cap.
    assert (generation.fallback_tier, generation.capacity_at_pop) == (2, 1200)
    assert list(Generation.objects.over_capacity()) == [generation]


def test_a_worker_in_maintenance_or_serving_another_model_is_not_capable_for_the_job(
    requester, owner, trusted_owner
):
    _worker(trusted_owner, "fast-in-maintenance", 40)
    _worker(trusted_owner, "fast-other-model", 40)
    Worker.objects.filter(name="fast-in-maintenance").update(maintenance=True)
    Worker.objects.filter(name="fast-other-model").update(served_models=["other-model"])
    _worker(owner, "slow", 10)
    job = queue_chat(requester, 1500)
    assert _pop(owner, "slow").request_id == job.id


def test_the_fallback_prefers_a_worker_that_can_finish_within_its_own_cap(requester, owner, trusted_owner):
    # 3000 tokens: beyond both workers' base-lease capacity (1200). Within the trusted cap,
    # 10 x (600 - 30) = 5700 covers it; within the untrusted cap, 10 x (200 - 30) = 1700 does not.
    _worker(owner, "untrusted-slow", 10)
    _worker(trusted_owner, "trusted-slow", 10)
    job = queue_chat(requester, 3000)
    assert _pop(owner, "untrusted-slow") is None
    generation = _pop(trusted_owner, "trusted-slow")
    assert generation.request_id == job.id
    assert generation.fallback_tier == 2


def test_a_worker_that_cannot_finish_even_within_its_cap_is_the_last_resort(requester, owner, trusted_owner):
    _worker(owner, "untrusted-slow", 10)
    _worker(trusted_owner, "trusted-slow", 10)
    Worker.objects.filter(name="trusted-slow").update(last_pop_at=timezone.now() - timedelta(seconds=301))
    job = queue_chat(requester, 3000)
    generation = _pop(owner, "untrusted-slow")
    assert generation.request_id == job.id
    assert generation.fallback_tier == 3


def test_a_legacy_text_job_is_offered_whatever_its_length(requester, owner, trusted_owner):
    _worker(trusted_owner, "fast", 1000)
    _worker(owner, "slow", 1)
    give_kudos(requester)  # a request of over 512 tokens needs its kudos upfront
    requester.request_text(models=["chat-model"], params={"max_length": 16384, "max_context_length": 32768})
    generation = _pop(owner, "slow")
    assert generation is not None
    assert (generation.request.kind, generation.fallback_tier) == ("text", 1)


@pytest.mark.parametrize("end", ["done", "aborted", "faulted", "cancelled"])
def test_an_over_capacity_assignment_records_its_outcome(requester, owner, end, time_machine):
    time_machine.move_to("2026-07-01 00:00:00+00:00", tick=False)
    _worker(owner, "slow", 10)
    job = queue_chat(requester, 1500)
    generation = _pop(owner, "slow")
    assert generation.fallback_tier == 2 and generation.state == "processing"
    if end == "done":
        owner.submit(generation.id, "a reply")
    elif end == "aborted":
        time_machine.shift(151)
        abort_stale_generations()
    elif end == "faulted":
        owner.submit(generation.id, "Faulted", state="faulted")
    else:
        owner.client.delete(f"/api/v2/generate/text/status/{job.id}")
    [assignment] = Generation.objects.over_capacity()
    assert (assignment.state, assignment.capacity_at_pop, assignment.request.max_length) == (end, 1200, 1500)


def test_pops_by_a_chat_worker_declaring_more_than_its_capacity_are_counted(owner):
    before = metrics.value(metrics.POP_LEASE_CAPACITY_LIMITED)
    owner.pop("declares-16384", **DECLARED)  # unmeasured: capacity 1200 < 16384
    owner.pop("declares-16384", **DECLARED)
    owner.pop("declares-1200", **{**DECLARED, "max_length": 1200})
    owner.pop("text-worker", models=["chat-model"], max_length=16384)
    assert metrics.value(metrics.POP_LEASE_CAPACITY_LIMITED) == before + 2


def test_a_capacity_limited_pop_is_recorded_on_its_generation(requester, owner):
    _worker(owner, "limited", None)
    queue_chat(requester, 500)
    generation = _pop(owner, "limited")
    assert (generation.capacity_limited, generation.fallback_tier) == (True, 1)


def test_the_status_counts_only_the_workers_the_pop_would_offer_the_job(requester, owner, trusted_owner):
    _worker(owner, "slow", 10)
    job = queue_chat(requester, 1500)
    status = _status(requester, job)
    assert (status["eligible_workers"], status["might_stall"], status["is_possible"]) == (1, True, True)
    _worker(trusted_owner, "fast", 40)
    Worker.objects.filter(name="fast").update(threads=3)
    status = _status(requester, job)
    assert (status["eligible_workers"], status["eligible_worker_threads"]) == (1, 3)
    assert status["might_stall"] is False


def test_a_request_no_online_worker_can_serve_is_not_possible(requester, owner):
    _worker(owner, "small", 1000)
    job = queue_chat(requester, 1500)
    # The worker declares less since (a /v1 request above every worker's max_length is refused).
    Worker.objects.filter(name="small").update(max_length=512)
    status = _status(requester, job)
    assert (status["eligible_workers"], status["is_possible"], status["might_stall"]) == (0, False, False)
