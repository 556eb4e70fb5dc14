"""The stale pass: leases that lapsed are aborted, their requests restarted."""

from collections import Counter
from datetime import timedelta

from django.core.management import call_command
from django.utils import timezone

from hordeops import metrics
from jobs.models import Generation, TextRequest
from jobs.services import abort_stale_generations
from workers.models import Account, Worker

T0 = "2026-03-01 12:00:00+00:00"


def _queue_and_pop(requester, owner, worker="w", **params):
    owner.pop(worker)
    request_id = requester.request_text(models=["m1"], params=params or {"max_length": 80}).json()["id"]
    job = owner.pop(worker).json()
    assert job["id"], "the worker should have been given the job"
    return request_id, job["id"]


def test_a_generation_inside_its_lease_is_left_alone(requester, owner, clock):
    _, generation_id = _queue_and_pop(requester, owner)
    clock.shift(150)  # exactly at the lease end: not yet past it
    assert abort_stale_generations().aborted == 0
    assert Generation.objects.get(pk=generation_id).state == Generation.State.PROCESSING


def test_a_generation_past_its_lease_is_aborted_and_its_request_restarted(requester, owner, clock):
    request_id, generation_id = _queue_and_pop(requester, owner)
    clock.shift(151)
    result = abort_stale_generations()
    assert result.aborted == 1
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.ABORTED
    request = TextRequest.objects.get(pk=request_id)
    assert (request.state, request.queued, request.restarts) == ("active", 1, 1)
    worker = Worker.objects.get(name="w")
    assert (worker.aborted_jobs, worker.uncompleted_jobs) == (1, 1)
    status = requester.status(request_id).json()
    assert (status["restarted"], status["waiting"], status["processing"]) == (1, 1, 0)
    # The restarted job goes to the next worker that pops.
    assert owner.pop("w2").json()["id"] not in (None, generation_id)


def test_a_submit_after_the_lease_but_before_the_pass_is_accepted(requester, owner, clock):
    request_id, generation_id = _queue_and_pop(requester, owner)
    clock.shift(159)  # the lease ended at 150 s; the pass has not come yet
    assert owner.submit(generation_id, "made it").status_code == 200
    clock.shift(2)
    assert abort_stale_generations().aborted == 0
    assert requester.status(request_id).json()["done"] is True


def test_a_submit_one_second_after_the_pass_gets_AbortedGen_stating_the_lease(requester, owner, clock):
    request_id, generation_id = _queue_and_pop(requester, owner)
    clock.shift(160)
    assert abort_stale_generations().aborted == 1
    clock.shift(1)
    refused = owner.submit(generation_id, "too late")
    assert refused.status_code == 400
    assert refused.json()["rc"] == "AbortedGen"
    message = refused.json()["message"]
    assert "150 s" in message and "200 s" in message
    assert Generation.objects.get(pk=generation_id).text is None
    assert requester.status(request_id).json()["finished"] == 0


def test_the_pass_reads_the_job_ttl_on_the_row(requester, owner, clock):
    _, generation_id = _queue_and_pop(requester, owner)
    Generation.objects.filter(pk=generation_id).update(job_ttl=180)  # as a granted renewal writes it
    clock.shift(170)
    assert abort_stale_generations().aborted == 0
    clock.shift(11)
    assert abort_stale_generations().aborted == 1


def test_a_request_faults_after_the_maximum_restarts(requester, owner, clock, settings):
    settings.TEXT_REQUEST_MAX_RESTARTS = 2
    owner.pop("w")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    for expected_state in ("active", "faulted"):
        assert owner.pop("w").json()["id"]
        clock.shift(151)
        abort_stale_generations()
        assert TextRequest.objects.get(pk=request_id).state == expected_state
    status = requester.status(request_id).json()
    assert (status["faulted"], status["done"], status["restarted"], status["waiting"]) == (True, True, 2, 0)
    assert owner.pop("w").json()["id"] is None


def test_a_worker_past_the_abort_threshold_goes_into_maintenance(requester, owner, clock, settings):
    settings.WORKER_ABORT_MAINTENANCE_THRESHOLD = 2
    settings.TEXT_REQUEST_MAX_RESTARTS = 1  # aborted requests fault, so each pop takes a new one
    owner.pop("w")
    for _ in range(2):
        _queue_and_pop(requester, owner)
        clock.shift(151)
        abort_stale_generations()
    assert Worker.objects.get(name="w").maintenance is False
    _queue_and_pop(requester, owner)
    clock.shift(151)
    assert abort_stale_generations().maintenance == ["w"]
    worker = Worker.objects.get(name="w")
    assert worker.maintenance is True
    assert "dropping too many jobs" in worker.maintenance_reason
    requester.request_text(models=["m1"])
    refused = owner.pop("w")
    assert refused.status_code == 403
    assert refused.json()["rc"] == "WorkerMaintenance"


def test_a_worker_in_maintenance_still_serves_its_own_account(owner, clock):
    owner.pop("w")
    Worker.objects.filter(name="w").update(maintenance=True)
    owner.request_text(models=["m1"])
    assert owner.pop("w").json()["id"] is not None


def test_aborts_older_than_an_hour_do_not_count_towards_maintenance(requester, owner, clock, settings):
    settings.WORKER_ABORT_MAINTENANCE_THRESHOLD = 2
    settings.TEXT_REQUEST_MAX_RESTARTS = 1  # aborted requests fault, so each pop takes a new one
    for _ in range(2):
        _queue_and_pop(requester, owner)
        clock.shift(151)
        abort_stale_generations()
    clock.shift(3600)
    _queue_and_pop(requester, owner)
    clock.shift(151)
    abort_stale_generations()
    worker = Worker.objects.get(name="w")
    assert (worker.maintenance, worker.aborted_jobs) == (False, 1)


def test_the_abort_window_includes_its_last_instant_in_the_pass_and_on_the_worker(owner, clock):
    from datetime import timedelta

    from django.utils import timezone

    from workers.services import count_aborts

    owner.pop("w")
    worker = Worker.objects.get(name="w")
    now = timezone.now()
    Worker.objects.filter(pk=worker.pk).update(aborts_window_start=now - timedelta(hours=1), aborted_jobs=3)
    worker.refresh_from_db()
    assert worker.aborts_in_window(now) == 3  # exactly an hour old: still the same window
    count_aborts(counts=Counter([worker.pk]), now=now)
    worker.refresh_from_db()
    assert (worker.aborted_jobs, worker.aborts_window_start) == (4, now - timedelta(hours=1))
    later = now + timedelta(microseconds=1)
    assert worker.aborts_in_window(later) == 0  # past the hour, on both sides
    count_aborts(counts=Counter([worker.pk]), now=later)
    worker.refresh_from_db()
    assert (worker.aborted_jobs, worker.aborts_window_start) == (1, later)


def test_a_request_past_its_lifetime_expires_and_its_generation_is_cancelled(
    requester, owner, clock, settings
):
    settings.TEXT_REQUEST_LIFETIME_SECONDS = 100
    owner.pop("w", chat=True)
    waiting_id = requester.request_text(models=["m1"], params={"n": 2}).json()["id"]
    generation_id = owner.pop("w", chat=True).json()["id"]
    Generation.objects.filter(pk=generation_id).update(job_ttl=200, cap_seconds=200)
    clock.shift(101)
    result = abort_stale_generations()
    assert (result.expired_requests, result.cancelled_by_expiry, result.aborted) == (1, 1, 0)
    status = requester.status(waiting_id).json()
    assert (status["done"], status["faulted"], status["waiting"]) == (True, True, 0)
    late = owner.submit(generation_id)
    assert (late.status_code, late.json()["rc"]) == (409, "GenerationCancelled")
    assert Worker.objects.get(name="w").aborted_jobs == 0


def test_the_pass_aborts_many_generations_in_a_fixed_number_of_queries(
    requester, owner, clock, django_assert_num_queries
):
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=31)  # 31 workers
    owner.pop("w")
    for _ in range(30):
        requester.request_text(models=["m1"])
    for i in range(30):
        owner.pop(f"w{i % 3}")
    clock.shift(151)
    # the followed requests (none has lost its follower), lock, cancel expired, expire, abort,
    # restart requests, count aborts; plus the SAVEPOINT and RELEASE of running inside the
    # test's transaction.
    with django_assert_num_queries(9):
        assert abort_stale_generations().aborted == 30


def _stale_aborts() -> dict[str, float]:
    return {t: metrics.value(metrics.STALE_ABORTS, t) for t in metrics.TRUST_LABELS}


def test_stale_aborts_are_counted_by_trust_once_the_pass_commits(
    requester, owner, trusted_owner, clock, django_capture_on_commit_callbacks
):
    before = _stale_aborts()
    _queue_and_pop(requester, owner, "untrusted-w")
    _queue_and_pop(requester, trusted_owner, "trusted-w")
    clock.shift(601)
    with django_capture_on_commit_callbacks(execute=True):
        abort_stale_generations()
    after = _stale_aborts()
    assert after["trusted"] - before["trusted"] == 1
    assert after["untrusted"] - before["untrusted"] == 1


def test_the_management_command_runs_one_pass(requester, owner, clock, capsys):
    _, generation_id = _queue_and_pop(requester, owner)
    clock.shift(timedelta(seconds=151))
    call_command("abort_stale_generations")
    assert "Aborted 1 stale generations" in capsys.readouterr().out
    assert Generation.objects.get(pk=generation_id).state == Generation.State.ABORTED


def test_the_stale_read_query_lists_exactly_what_the_pass_aborts(requester, owner, clock):
    _, first = _queue_and_pop(requester, owner, "w1")
    clock.shift(100)
    _, second = _queue_and_pop(requester, owner, "w2")
    clock.shift(60)  # the first lease lapsed at 150 s; the second has 90 s left
    now = timezone.now()
    assert [str(g.pk) for g in Generation.objects.stale(now)] == [first]
    abort_stale_generations(now=now)
    assert Generation.objects.get(pk=first).state == Generation.State.ABORTED
    assert Generation.objects.get(pk=second).state == Generation.State.PROCESSING


def test_the_pass_first_makes_the_cancellations_that_waited_for_the_database(requester, owner, clock):
    from django_redis import get_redis_connection

    from jobs.services import defer_cancellations
    from jobs.services.endings import DEFERRED_KEY

    request_id, generation_id = _queue_and_pop(requester, owner)
    # Its requester left while PostgreSQL was down: the web process recorded the cancellation.
    defer_cancellations(reasons={request_id: "ServiceUnavailable"})
    clock.shift(151)  # and its lease lapsed meanwhile
    result = abort_stale_generations()
    assert (result.deferred_cancellations, result.aborted) == (1, 0)  # cancelled, not restarted
    request = TextRequest.objects.get(pk=request_id)
    assert (request.state, request.queued, request.restarts) == ("cancelled", 0, 0)
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.CANCELLED
    assert generation.settlement_information["reason"] == "ServiceUnavailable"
    assert not get_redis_connection("default").exists(DEFERRED_KEY)
    assert abort_stale_generations().deferred_cancellations == 0
