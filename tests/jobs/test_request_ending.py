"""A request that did not finish records why it ended: the requester, its deadline, its
lifetime, its restarts, or a job lost after its stream was committed."""

from jobs.models import TextRequest
from jobs.services import abort_stale_generations, cancel_request, commit_stream
from tests.conftest import queue_chat

T0 = "2026-03-01 12:00:00+00:00"
Ending = TextRequest.Ending


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
    assert _ending(chat.pk) == (TextRequest.State.FAULTED, Ending.AFTER_COMMIT)
