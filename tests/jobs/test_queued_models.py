"""`jobs_queuedmodel`, the pop's per-model queue: the database keeps exactly one row per model
of every request that is active with jobs queued ('' for one that names no model), whichever
statement queues, claims, restarts, cancels, expires or faults it."""

import uuid

from jobs.models import QUEUE_SHAPE, QueuedModel, TextRequest
from jobs.services import abort_stale_generations, cancel_request
from tests.conftest import queue_chat

T0 = "2026-03-01 12:00:00+00:00"


def expected() -> set[tuple[str, str]]:
    return {
        (str(r.id), model)
        for r in TextRequest.objects.filter(state=TextRequest.State.ACTIVE, queued__gt=0)
        for model in (r.requested_models or [""])
    }


def kept() -> set[tuple[str, str]]:
    rows = set(QueuedModel.objects.values_list("request_id", "model"))
    return {(str(request_id), model) for request_id, model in rows}


def test_each_queued_request_has_a_row_per_model_and_loses_them_when_its_jobs_are_all_taken(requester, owner):
    owner.pop("w", models=["m1", "m2"])
    two = requester.request_text(models=["m1", "m2", "m1"], params={"n": 2, "max_length": 80}).json()["id"]
    anything = requester.request_text(models=[]).json()["id"]
    assert kept() == expected() == {(two, "m1"), (two, "m2"), (anything, "")}
    owner.pop("w", models=["m1", "m2"])  # one of the two jobs: still queued
    assert (two, "m1") in kept() and kept() == expected()
    owner.pop("w", models=["m1", "m2"])  # the second: no longer queued
    assert kept() == expected() == {(anything, "")}
    row = QueuedModel.objects.get(request_id=anything)
    request = TextRequest.objects.get(pk=anything)
    assert (row.fair_rank, row.priority) == (request.fair_rank, request.priority)
    assert row.created_at == request.created_at


def test_a_restarted_job_brings_its_rows_back_and_an_ending_takes_them_away(requester, owner, clock):
    owner.pop("w")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    owner.pop("w")
    assert kept() == expected() == set()
    clock.shift(151)  # the lease lapsed: the pass restarts the job
    assert abort_stale_generations().aborted == 1
    assert kept() == expected() == {(request_id, "m1")}
    cancel_request(request_id=request_id)
    assert kept() == expected() == set()


def test_expired_and_faulted_requests_have_no_rows(requester, owner, clock, settings):
    settings.TEXT_REQUEST_MAX_RESTARTS = 1
    owner.pop("w", models=["m1", "chat-model"], chat=True, max_length=4096, max_context_length=8192)
    assert requester.request_text(models=["m1"]).status_code == 202
    queue_chat(requester, 100)
    assert len(kept()) == 2
    owner.pop("w", models=["m1", "chat-model"], chat=True, max_length=4096, max_context_length=8192)
    clock.shift(151)
    abort_stale_generations()  # the popped one is past its one restart: faulted
    assert TextRequest.objects.filter(state=TextRequest.State.FAULTED).count() == 1
    assert kept() == expected() and len(kept()) == 1
    clock.shift(1200)  # past the lifetime: the pass expires what waits
    abort_stale_generations()
    assert kept() == expected() == set()


def test_each_row_carries_its_requests_shape_and_follows_a_change_of_it(requester, owner):
    owner.pop("w", models=["m1"], chat=True, max_length=4096, max_context_length=8192)
    chat = queue_chat(requester, 300, model="m1")
    TextRequest.objects.filter(pk=chat.pk).update(trusted_workers=True, allowed_workers=[uuid.uuid4()])
    row = QueuedModel.objects.values(*QUEUE_SHAPE).get(request_id=chat.pk)
    request = TextRequest.objects.get(pk=chat.pk)
    assert row == {
        "kind": "chat",
        "max_length": 300,
        "max_context_length": request.max_context_length,
        "trusted_workers": True,
        "targeted": True,
    }
    TextRequest.objects.filter(pk=chat.pk).update(max_length=200, allowed_workers=[])
    assert QueuedModel.objects.values_list("max_length", "targeted").get(request_id=chat.pk) == (200, False)
    assert kept() == expected()
