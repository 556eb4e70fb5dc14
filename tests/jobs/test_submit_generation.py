"""The submit: ownership, duplicates, and the race with the stale pass."""

import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F

from hordeops import errors
from jobs.models import Generation, TextRequest
from jobs.services import abort_stale_generations, submit_generation
from jobs.services.posts import worker_post
from kudos import sizes


def _queue_and_pop(requester, owner, worker="w"):
    owner.pop(worker)
    request_id = requester.request_text(models=["m1"]).json()["id"]
    return request_id, owner.pop(worker).json()["id"]


def test_an_unknown_generation_is_InvalidJobID(owner):
    refused = owner.submit(uuid.uuid4())
    assert (refused.status_code, refused.json()["rc"]) == (404, "InvalidJobID")


def test_a_posted_generation_loads_with_its_workers_account_and_its_requests_kind(requester, owner):
    request_id, generation_id = _queue_and_pop(requester, owner)
    post = worker_post(generation_id=generation_id, api_key=owner.api_key)
    assert post.caller.pk == owner.account.pk
    loaded = post.generation
    expected = Generation.objects.select_related("worker", "request").get(pk=generation_id)
    assert [getattr(loaded, f.attname) for f in Generation._meta.concrete_fields] == [
        getattr(expected, f.attname) for f in Generation._meta.concrete_fields
    ]
    assert loaded.worker.account_id == owner.account.id
    assert str(loaded.request.pk) == request_id
    assert (loaded.request.kind, loaded.request.max_length, loaded.request.deadline_at) == (
        expected.request.kind,
        expected.request.max_length,
        None,
    )
    unknown = worker_post(generation_id=uuid.uuid4(), api_key=requester.api_key)
    assert unknown.caller.pk == requester.account.pk and unknown.generation is None
    assert worker_post(generation_id=generation_id, api_key="no such key") is None


def test_a_bad_key_is_refused_before_an_unknown_or_foreign_generation(requester, owner):
    _, generation_id = _queue_and_pop(requester, owner)
    for job_id in (uuid.uuid4(), generation_id):
        refused = requester.client.post(
            "/api/v2/generate/text/submit",
            {"id": str(job_id), "generation": "x"},
            format="json",
            HTTP_APIKEY="no such key",
        )
        assert (refused.status_code, refused.json()["rc"]) == (401, "InvalidAPIKey")
    assert Generation.objects.get(pk=generation_id).state == Generation.State.PROCESSING


def test_a_worker_cannot_submit_another_workers_generation(requester, owner, make_caller):
    _, generation_id = _queue_and_pop(requester, owner)
    other = make_caller("other-owner")
    other.pop("other-worker")
    refused = other.submit(generation_id, "stolen")
    assert (refused.status_code, refused.json()["rc"]) == (403, "WrongCredentials")
    assert Generation.objects.get(pk=generation_id).state == Generation.State.PROCESSING
    assert owner.submit(generation_id, "mine").status_code == 200


def test_a_second_submit_is_DuplicateGen_and_keeps_the_first_text(requester, owner):
    request_id, generation_id = _queue_and_pop(requester, owner)
    assert owner.submit(generation_id, "first").status_code == 200
    refused = owner.submit(generation_id, "second")
    assert (refused.status_code, refused.json()["rc"]) == (400, "DuplicateGen")
    assert Generation.objects.get(pk=generation_id).text == "first"
    assert requester.status(request_id).json()["finished"] == 1


def test_a_censored_result_is_stored_with_its_state(requester, owner):
    request_id, generation_id = _queue_and_pop(requester, owner)
    assert owner.submit(generation_id, "", state="censored").status_code == 200
    [generation] = requester.status(request_id).json()["generations"]
    assert generation["state"] == "censored"


def test_a_given_back_job_cannot_then_be_submitted(requester, owner):
    _, generation_id = _queue_and_pop(requester, owner)
    owner.submit(generation_id, "Faulted", state="faulted")
    refused = owner.submit(generation_id, "after all")
    assert (refused.status_code, refused.json()["rc"]) == (400, "AbortedGen")


def test_the_submit_costs_a_pinned_number_of_queries(requester, owner, django_assert_num_queries):
    _, generation_id = _queue_and_pop(requester, owner)
    sizes.billions("any")  # the model table, read once per process every REFRESH_SECONDS
    # the key's account with the generation, its worker and request, and one statement for
    # the compare-and-set, the request's count and cost, the worker's speed, the kudos and the
    # request's hold.
    with django_assert_num_queries(2):
        assert owner.submit(generation_id, "done").status_code == 200


def _race_submit_against_the_pass(owner, generation_id) -> object:
    """Run a submit and a stale pass at once; return the submit's reward or its AbortedGen."""
    start = threading.Barrier(2)
    submitted: list[object] = []

    def submit() -> None:
        try:
            start.wait()
            submitted.append(
                submit_generation(
                    api_key=owner.api_key,
                    generation_id=generation_id,
                    text="in time?",
                    state="ok",
                    seed=0,
                    gen_metadata=[],
                )
            )
        except errors.AbortedGen as exc:
            submitted.append(exc)
        finally:
            connection.close()

    def stale_pass() -> None:
        try:
            start.wait()
            abort_stale_generations()
        finally:
            connection.close()

    threads = [threading.Thread(target=submit), threading.Thread(target=stale_pass)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [answer] = submitted
    return answer


@pytest.mark.django_db(transaction=True)
def test_a_submit_racing_the_stale_pass_ends_as_exactly_one_outcome(make_caller, settings):
    settings.WORKER_ABORT_MAINTENANCE_THRESHOLD = 100  # 25 rounds may abort more than 20
    requester = make_caller("requester")
    owner = make_caller("owner")
    owner.pop("w")
    outcomes = []
    for round_ in range(25):
        request_id = requester.request_text(f"race {round_}").json()["id"]
        generation_id = owner.pop("w").json()["id"]
        # Lapse the lease by moving the pop back: psycopg cannot connect under a frozen clock.
        Generation.objects.filter(pk=generation_id).update(popped_at=F("popped_at") - timedelta(seconds=151))

        answer = _race_submit_against_the_pass(owner, generation_id)

        generation = Generation.objects.get(pk=generation_id)
        request = TextRequest.objects.get(pk=request_id)
        if isinstance(answer, errors.AbortedGen):
            assert generation.state == Generation.State.ABORTED
            assert generation.text is None
            assert (request.state, request.queued, request.restarts, request.finished) == ("active", 1, 1, 0)
            outcomes.append("aborted")
            # Drain the restarted job so the next round starts from an empty queue.
            owner.submit(owner.pop("w").json()["id"], "second try")
        else:
            assert generation.state == Generation.State.DONE
            assert generation.text == "in time?"
            assert (request.state, request.queued, request.restarts, request.finished) == ("done", 0, 0, 1)
            outcomes.append("accepted")
    assert len(outcomes) == 25
    print("race outcomes:", Counter(outcomes))
