"""What a worker claims (its token count, its speed) is bounded by what the server saw."""

import importlib

from django.apps import apps
from django.db import connection
from django_redis import get_redis_connection

from jobs import relay
from jobs.models import Generation
from jobs.services import cancel_request
from tests.conftest import progress
from workers.capacity import CAPACITY_CEILING
from workers.models import Worker

T0 = "2026-06-01 08:00:00+00:00"


def _done_event(request_id) -> dict[bytes, bytes]:
    entries = get_redis_connection("default").xrange(relay.relay_key(request_id))
    (done,) = [fields for _, fields in entries if fields[b"type"] == relay.DONE.encode()]
    return done


def test_a_reported_token_count_past_the_jobs_length_counts_as_the_length(
    chat_job, owner, clock, django_capture_on_commit_callbacks
):
    job = chat_job(owner, max_length=16)
    clock.shift(10)
    assert progress(owner, job["id"], 1, "sixteen tokens of words", tokens=10_000_000).status_code == 200
    clock.shift(1)
    with django_capture_on_commit_callbacks(execute=True):
        submitted = owner.submit(job["id"], "sixteen tokens of words")
    assert submitted.status_code == 200, submitted.content
    generation = Generation.objects.get(pk=job["id"])
    assert generation.tokens == 16 and submitted.json()["reward"] == generation.reward
    assert _done_event(generation.request_id)[b"tokens"] == b"16"
    worker = Worker.objects.get(name="chat-worker")
    assert worker.tokens_generated == 16
    assert worker.speed == 16 / 11


def test_a_reported_token_count_past_the_bytes_handed_in_counts_as_those_bytes(chat_job, owner, clock):
    job = chat_job(owner, max_length=1024)
    clock.shift(10)
    progress(owner, job["id"], 1, "abc", tokens=900)
    assert owner.submit(job["id"], "abc").status_code == 200
    assert Generation.objects.get(pk=job["id"]).tokens == 3


def test_a_count_within_what_was_handed_in_is_taken_as_reported(chat_job, owner, clock):
    job = chat_job(owner, max_length=1024)
    clock.shift(10)
    progress(owner, job["id"], 1, "Once upon a time, ", tokens=5)
    assert owner.submit(job["id"], "Once upon a time, there was a story.").status_code == 200
    assert Generation.objects.get(pk=job["id"]).tokens == 5


def test_a_cancelled_jobs_tokens_relayed_are_bounded_by_the_bytes_relayed(chat_job, owner, clock):
    job = chat_job(owner, max_length=1024)
    clock.shift(10)
    progress(owner, job["id"], 1, "four", tokens=10_000_000)
    generation = Generation.objects.get(pk=job["id"])
    cancel_request(request_id=generation.request_id)
    generation.refresh_from_db()
    assert generation.settlement_information["tokens_relayed"] == 4


def test_a_job_submitted_at_once_counts_at_most_the_speed_ceiling(requester, owner, clock, settings):
    settings.TEXT_WORKER_MAX_TOKENS_PER_SECOND = 300
    owner.pop("fast-claims")
    requester.request_text(models=["m1"], params={"max_length": 512})
    job = owner.pop("fast-claims").json()
    assert owner.submit(job["id"], "word " * 400).status_code == 200  # no time passed at all
    worker = Worker.objects.get(name="fast-claims")
    assert worker.speed_samples == [300.0] and worker.speed == 300.0
    assert Generation.objects.get(pk=job["id"]).tokens == 500  # the AI Horde's 4-character estimate


def test_a_worker_measured_past_any_capacity_still_pops_within_the_columns_range(requester, owner):
    owner.pop("overflowing", models=["chat-model"], chat=True, max_length=16384)
    Worker.objects.filter(name="overflowing").update(speed=2.4e8, speed_samples=[2.4e8])
    requester_job = requester.request_text(models=["chat-model"])
    assert requester_job.status_code == 202
    popped = owner.pop("overflowing", models=["chat-model"], chat=True, max_length=16384)
    assert popped.status_code == 200, popped.content
    assert Generation.objects.get(pk=popped.json()["id"]).capacity_at_pop == CAPACITY_CEILING


def test_the_migration_brings_speeds_measured_before_the_ceiling_within_it(owner, settings):
    settings.TEXT_WORKER_MAX_TOKENS_PER_SECOND = 500
    for name in ("cheat", "honest", "unmeasured"):
        owner.pop(name)
    Worker.objects.filter(name="cheat").update(speed=(2.4e8 + 20) / 2, speed_samples=[2.4e8, 20])
    Worker.objects.filter(name="honest").update(speed=30, speed_samples=[20, 40])
    migration = importlib.import_module("workers.migrations.0008_speed_samples_within_ceiling")
    with connection.schema_editor() as editor:
        migration.clamp(apps, editor)
    speeds = {w.name: (w.speed, w.speed_samples) for w in Worker.objects.all()}
    assert speeds == {
        "cheat": (260.0, [500.0, 20.0]),
        "honest": (30.0, [20.0, 40.0]),
        "unmeasured": (None, []),
    }
