"""The stale pass as Celery runs it: a beat entry, a registered task, a real worker."""

import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.utils import timezone

from hordeops.celery import app
from jobs.models import Generation, TextRequest
from jobs.tasks import abort_stale_generations_task
from kudos.models import Event
from kudos.tasks import kudos_pass_task
from tests.hordeops.test_metrics import scrape
from workers.models import Worker

ROOT = Path(__file__).resolve().parents[2]


def test_every_beat_entry_names_a_registered_task():
    app.loader.import_default_modules()
    assert settings.CELERY_BEAT_SCHEDULE
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks


def test_the_stale_pass_runs_every_STALE_GENERATION_PASS_SECONDS():
    entry = settings.CELERY_BEAT_SCHEDULE["every-pass-abort-stale-generations"]
    assert entry["task"] == abort_stale_generations_task.name
    assert entry["schedule"].run_every == timedelta(seconds=settings.STALE_GENERATION_PASS_SECONDS)


def test_the_kudos_pass_runs_every_KUDOS_PASS_SECONDS():
    entry = settings.CELERY_BEAT_SCHEDULE["every-pass-kudos"]
    assert entry["task"] == kudos_pass_task.name
    assert entry["schedule"].run_every == timedelta(seconds=settings.KUDOS_PASS_SECONDS)


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_a_real_celery_worker_runs_the_stale_pass(make_caller):
    requester = make_caller("requester")
    owner = make_caller("owner")
    owner.pop("w")
    aborts = ("horde_text_stale_aborts_total", (("trust", "untrusted"),))
    before = scrape()[aborts]
    request_id = requester.request_text().json()["id"]
    generation_id = owner.pop("w").json()["id"]
    Generation.objects.filter(pk=generation_id).update(popped_at=F("popped_at") - timedelta(seconds=151))

    output = _run_in_a_celery_worker(
        abort_stale_generations_task,
        lambda: Generation.objects.get(pk=generation_id).state == Generation.State.ABORTED,
    )
    assert Generation.objects.get(pk=generation_id).state == Generation.State.ABORTED, output
    request = TextRequest.objects.get(pk=request_id)
    assert (request.queued, request.restarts) == (1, 1)
    assert "abort_stale_generations_task" in output
    # Counted in the Celery worker's process (just after its commit), shown on this web
    # process's /metrics.
    deadline = time.monotonic() + 10
    while scrape()[aborts] < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scrape()[aborts] == before + 1


@pytest.mark.django_db(transaction=True)
def test_a_real_celery_worker_runs_the_kudos_pass(make_caller):
    owner = make_caller("owner", trusted=True)
    owner.pop("w")
    Worker.objects.update(uptime_paid_until=timezone.now() - timedelta(seconds=601))
    output = _run_in_a_celery_worker(
        kudos_pass_task, lambda: Event.objects.filter(kind=Event.Kind.UPTIME).exists()
    )
    assert Worker.objects.get().kudos_uptime > 0, output
    assert "kudos_pass_task" in output


def _run_in_a_celery_worker(task, done) -> str:
    """Run a real Celery worker, sending it `task` until `done()`; its output."""
    # A queue of this test's own, so that no other worker on the broker takes the task.
    queue = f"test-{uuid.uuid4().hex}"
    env = {**os.environ, "DATABASE_URL": _database_url(), "REDIS_URL": settings.REDIS_URL}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "hordeops",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel=INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        next_send = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_send:
                # Sent again now and then: a pass is idempotent, and a slow worker start
                # or another test run emptying the broker must not lose the only message.
                task.apply_async(queue=queue, expires=30)
                next_send = time.monotonic() + 10
            if done():
                break
            assert worker.poll() is None, worker.stdout.read()
            time.sleep(0.2)
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
    return output


@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_follows_a_sentinel_failover_of_its_broker(sentinel_redis, make_caller):
    from celery import Celery

    requester, owner = make_caller("requester"), make_caller("owner")
    owner.pop("w")

    def lapsed_generation() -> str:
        requester.request_text()
        generation_id = owner.pop("w").json()["id"]
        Generation.objects.filter(pk=generation_id).update(popped_at=F("popped_at") - timedelta(seconds=151))
        return generation_id

    def aborted(generation_id: str):
        return lambda: Generation.objects.get(pk=generation_id).state == Generation.State.ABORTED

    queue = f"test-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": sentinel_redis.primary.url,  # its database number; the host is the sentinels'
        "REDIS_SENTINELS": sentinel_redis.sentinels_setting,
        "REDIS_SENTINEL_SERVICE": sentinel_redis.SERVICE,
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "hordeops", "worker", "--pool=solo", "-Q", queue,
         "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel=INFO"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def run_until(done, broker_port: int) -> None:
        # Sent straight to whichever server is the primary now: the worker must find it itself.
        sender = Celery(broker=f"redis://127.0.0.1:{broker_port}/0")
        deadline, next_send = time.monotonic() + 60, 0.0
        while not done():
            assert time.monotonic() < deadline and worker.poll() is None, "the pass did not run"
            if time.monotonic() >= next_send:
                sender.send_task(abort_stale_generations_task.name, queue=queue, expires=30)
                next_send = time.monotonic() + 5
            time.sleep(0.2)
        sender.close()

    try:
        run_until(aborted(lapsed_generation()), sentinel_redis.primary.port)
        old_primary = sentinel_redis.primary.port
        sentinel_redis.primary.kill()
        deadline = time.monotonic() + 20
        while sentinel_redis.primary_port() == old_primary:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.1)
        run_until(aborted(lapsed_generation()), sentinel_redis.primary_port())
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
    assert output.count("abort_stale_generations_task") >= 2, output
