"""A request that did not finish records why it ended, in one vocabulary (`Ending`): the
requester, its deadline, its lifetime, its restarts, a job lost or given back after its stream
was committed, or a stream that gave no output in preflight."""

import pytest
from django.db import IntegrityError, transaction

from jobs.models import Ending, TextRequest
from jobs.services import abort_stale_generations, cancel_request, commit_stream, submit_generation
from tests.conftest import queue_chat

T0 = "2026-03-01 12:00:00+00:00"


def _ending(request_id) -> tuple[str, str]:
    request = TextRequest.objects.get(pk=request_id)
    return request.state, request.ending


def test_a_requesters_cancellation_and_a_deadlines_are_told_apart(requester):
    mine = requester.request_text(models=["m1"]).json()["id"]
    timed = requester.request_text(models=["m1"]).json()["id"]
    cancel_request(request_id=mine)
    cancel_request(request_id=timed, reason="generation_deadline_exceeded")
    assert _ending(mine) == (TextRequest.State.CANCELLED, Ending.CANCELLED)
    assert _ending(timed) == (TextRequest.State.CANCELLED, Ending.DEADLINE)
    done = requester.request_text(models=["m1"]).json()["id"]
    assert _ending(done) == (TextRequest.State.ACTIVE, Ending.NONE)


def test_a_request_past_its_lifetime_ends_expired_and_one_restarted_too_often_faulted(
    requester, owner, clock, settings
):
    settings.TEXT_REQUEST_MAX_RESTARTS = 1
    owner.pop("w")
    faulting = requester.request_text(models=["m1"]).json()["id"]
    owner.pop("w")
    clock.shift(151)  # its lease lapsed: past its one restart
    abort_stale_generations()
    assert _ending(faulting) == (TextRequest.State.FAULTED, Ending.RESTARTS)
    waiting = requester.request_text(models=["m2"]).json()["id"]
    clock.shift(settings.TEXT_REQUEST_LIFETIME_SECONDS + 1)
    abort_stale_generations()
    assert _ending(waiting) == (TextRequest.State.EXPIRED, Ending.LIFETIME)


def test_a_job_lost_after_its_stream_was_committed_faults_its_request_at_once(requester, owner, clock):
    declared = {"models": ["chat-model"], "chat": True, "max_length": 4096, "max_context_length": 8192}
    owner.pop("w", **declared)
    chat = queue_chat(requester, 300)
    job = owner.pop("w", **declared).json()
    commit_stream(request_id=chat.pk, generation_id=job["id"])
    clock.shift(151)
    abort_stale_generations()
    assert _ending(chat.pk) == (TextRequest.State.FAULTED, Ending.ABORTED)


def test_a_job_given_back_after_its_stream_was_committed_is_told_apart_from_a_lapsed_one(requester, owner):
    declared = {"models": ["chat-model"], "chat": True, "max_length": 4096, "max_context_length": 8192}
    owner.pop("w", **declared)
    chat = queue_chat(requester, 300)
    job = owner.pop("w", **declared).json()
    commit_stream(request_id=chat.pk, generation_id=job["id"])
    submit_generation(
        api_key=owner.api_key, generation_id=job["id"], text="", state="faulted", seed=0, gen_metadata=[]
    )
    assert _ending(chat.pk) == (TextRequest.State.FAULTED, Ending.GIVEN_BACK)


def test_a_stream_refused_in_preflight_is_listed_under_its_ending_in_the_admin(
    requester, owner, admin_client
):
    owner.pop("w", models=["chat-model"], chat=True, max_length=4096, max_context_length=8192)
    chat = queue_chat(requester, 300)
    cancel_request(request_id=chat.pk, reason="upstream_stream_invalid")
    page = admin_client.get("/admin/jobs/textrequest/", {"ending__exact": "upstream_stream_invalid"})
    assert page.status_code == 200
    assert [row.pk for row in page.context["cl"].result_list] == [chat.pk]
    offered = [
        choice["display"]
        for spec in page.context["cl"].filter_specs
        for choice in spec.choices(page.context["cl"])
    ]
    assert TextRequest.objects.get(pk=chat.pk).get_ending_display() in offered
    assert "upstream_stream_invalid" not in offered  # a label, not the raw code


def test_the_database_refuses_an_ending_that_is_not_one_of_the_choices(requester):
    queued = requester.request_text(models=["m1"]).json()["id"]
    with pytest.raises(IntegrityError), transaction.atomic():
        TextRequest.objects.filter(pk=queued).update(ending="restarts_exhausted_somehow")
