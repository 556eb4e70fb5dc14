"""A whole request -> pop -> submit -> status cycle over the horde routes."""

import uuid

import pytest

from jobs.models import Generation, TextRequest
from workers.models import Worker


def test_a_request_is_popped_submitted_and_reported_done(requester, owner):
    owner.pop("worker-1")  # the worker announces model m1 before anyone asks for it
    created = requester.request_text(
        "Tell me a story", models=["m1"], params={"max_length": 64, "temperature": 0.7}
    )
    assert created.status_code == 202
    request_id = created.json()["id"]

    popped = owner.pop("worker-1")
    assert popped.status_code == 200
    job = popped.json()
    assert job["id"] == job["ids"][0]
    assert uuid.UUID(job["id"])
    assert job["model"] == "m1"
    assert job["ttl"] == 150
    assert job["skipped"] == {}
    # Exactly the AI Horde's keys for a legacy worker, its defaulted sampler keys included.
    assert set(job) == {
        "payload", "id", "ids", "model", "ttl", "skipped", "messages", "softprompt", "extra_source_images"
    }  # fmt: skip
    assert job["payload"] == {
        "prompt": "Tell me a story",
        "n": 1,
        "max_length": 64,
        "max_context_length": 2048,
        "temperature": 0.7,
        "min_p": 0.0,
        "smoothing_factor": 0.0,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
    }

    waiting = requester.status(request_id).json()
    assert (waiting["processing"], waiting["finished"], waiting["done"]) == (1, 0, False)

    submitted = owner.submit(job["id"], "and they lived happily ever after", seed=42)
    assert submitted.status_code == 200
    assert submitted.json()["reward"] > 0

    status = requester.status(request_id).json()
    assert status["done"] is True
    assert status["faulted"] is False
    assert (status["finished"], status["processing"], status["waiting"]) == (1, 0, 0)
    [generation] = status["generations"]
    assert generation["text"] == "and they lived happily ever after"
    assert generation["seed"] == 42
    assert generation["worker_name"] == "worker-1"
    assert generation["worker_id"] == str(Worker.objects.get(name="worker-1").id)
    assert generation["model"] == "m1"
    assert generation["state"] == "ok"


def test_pop_with_no_job_answers_the_horde_empty_shape(owner):
    body = owner.pop("idle-worker").json()
    assert body["id"] is None
    assert body["ids"] == []
    assert body["skipped"] == {}
    assert body["model"] is None
    assert body["payload"] == {
        "min_p": 0.0,
        "smoothing_factor": 0.0,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "max_context_length": 2048,
        "max_length": 80,
    }
    assert "kind" not in body and "lease" not in body  # never as nulls
    chat_body = owner.pop("idle-chat-worker", chat=True).json()
    assert chat_body["id"] is None and "kind" not in chat_body and "lease" not in chat_body


def test_a_chat_worker_gets_the_kind_and_the_lease_of_a_text_job_and_a_legacy_worker_does_not(
    requester, owner
):
    owner.pop("legacy", models=["m1"])
    owner.pop("chatty", models=["m1"], chat=True)
    requester.request_text(models=["m1"])
    requester.request_text(models=["m1"])
    legacy = owner.pop("legacy", models=["m1"]).json()
    chatty = owner.pop("chatty", models=["m1"], chat=True).json()
    assert legacy["id"] and chatty["id"]
    assert "kind" not in legacy and "lease" not in legacy and "deadline_ms" not in legacy
    assert chatty["kind"] == "text"
    assert (chatty["lease"]["cap_seconds"], chatty["lease"]["preparation_seconds"]) == (200, 30)
    assert "messages" not in chatty["payload"]


def test_n_generations_are_handed_out_one_per_pop(requester, owner):
    owner.pop("w")
    request_id = requester.request_text(models=["m1"], params={"n": 2}).json()["id"]
    first = owner.pop("w").json()["id"]
    second = owner.pop("w").json()["id"]
    assert first != second
    assert owner.pop("w").json()["id"] is None
    owner.submit(first)
    assert requester.status(request_id).json()["done"] is False
    owner.submit(second)
    status = requester.status(request_id).json()
    assert status["done"] is True
    assert status["finished"] == 2


def test_amount_takes_several_jobs_of_one_request_in_one_pop(requester, owner):
    owner.pop("w")
    requester.request_text(models=["m1"], params={"n": 3})
    job = owner.pop("w", amount=2).json()
    assert len(job["ids"]) == 2
    assert TextRequest.objects.get().queued == 1


def test_submit_records_a_rolling_speed(requester, owner, settings):
    owner.pop("w")
    requester.request_text(models=["m1"], params={"max_length": 512})
    job = owner.pop("w").json()
    assert Worker.objects.get(name="w").speed is None
    owner.submit(job["id"], "x" * 400)  # about 100 tokens
    worker = Worker.objects.get(name="w")
    assert worker.speed is not None and worker.speed > 0
    assert worker.completed_jobs == 1
    assert len(worker.speed_samples) == 1


def test_the_speed_is_the_mean_of_the_last_twenty_samples(requester, owner, time_machine):
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("w")
    for i in range(22):
        requester.request_text(models=["m1"], params={"max_length": 512})
        job = owner.pop("w").json()
        # 400 characters -> 100 tokens; 10 s -> 10 tokens/s, except the first two jobs.
        time_machine.shift(1 if i < 2 else 10)
        owner.submit(job["id"], "x" * 400)
    worker = Worker.objects.get(name="w")
    assert len(worker.speed_samples) == Worker.SPEED_WINDOW
    assert worker.speed == pytest.approx(10.0)


def test_faulted_submit_gives_the_job_back_and_counts_an_abort(requester, owner):
    owner.pop("w")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    job = owner.pop("w").json()
    answer = owner.submit(job["id"], "Faulted", state="faulted")
    assert answer.status_code == 200
    assert answer.json() == {"reward": 0.0}
    assert Generation.objects.get(pk=job["id"]).state == Generation.State.FAULTED
    status = requester.status(request_id).json()
    assert (status["restarted"], status["waiting"], status["done"]) == (1, 1, False)
    assert Worker.objects.get(name="w").aborted_jobs == 1
    again = owner.pop("w").json()
    assert again["id"] not in (None, job["id"])


def test_cancel_drops_queued_work_and_cancels_running_generations(requester, owner):
    owner.pop("w")
    request_id = requester.request_text(models=["m1"], params={"n": 2}).json()["id"]
    running = owner.pop("w").json()["id"]
    cancelled = requester.client.delete(f"/api/v2/generate/text/status/{request_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["done"] is True
    assert cancelled.json()["waiting"] == 0
    assert owner.pop("w").json()["id"] is None
    # A legacy worker's submit is accepted, as the AI Horde accepts it, so that the official
    # worker ends the job at its first try; the text goes to no one.
    late = owner.submit(running, "nobody reads this")
    assert late.status_code == 200 and late.json()["reward"] == 0  # what its totals count
    worker = Worker.objects.get(name="w")
    assert (worker.kudos_rewards, worker.completed_jobs) == (0, 0)
    generation = Generation.objects.get(pk=running)
    assert (generation.state, generation.text) == (Generation.State.CANCELLED, None)
    assert owner.submit(running, state="faulted").json() == {"reward": 0.0}
    assert Worker.objects.get(name="w").aborted_jobs == 0


def test_a_chat_workers_submit_of_a_cancelled_job_is_refused_as_cancelled(requester, owner):
    owner.pop("cw", chat=True)
    request_id = requester.request_text(models=["m1"]).json()["id"]
    running = owner.pop("cw", chat=True).json()["id"]
    requester.client.delete(f"/api/v2/generate/text/status/{request_id}")
    late = owner.submit(running)
    assert (late.status_code, late.json()["rc"]) == (409, "GenerationCancelled")
    assert Worker.objects.get(name="cw").aborted_jobs == 0


def test_the_anonymous_key_can_request_text(anonymous, owner):
    owner.pop("w")
    assert anonymous.request_text(models=["m1"]).status_code == 202


def test_dry_run_answers_kudos_and_queues_nothing(requester, owner):
    owner.pop("w")
    answer = requester.request_text(models=["m1"], dry_run=True)
    assert answer.status_code == 200
    assert answer.json()["kudos"] > 0
    assert not TextRequest.objects.exists()


def test_the_status_route_accepts_an_uppercase_id(requester, owner):
    owner.pop("w")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    answer = requester.status(request_id.upper())
    assert answer.status_code == 200
    assert answer.json()["waiting"] == 1
