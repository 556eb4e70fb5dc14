"""The pop: filters, order, lease fields, concurrency and its query count."""

import json
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from rest_framework.renderers import JSONRenderer

from jobs.models import Generation, TextRequest
from jobs.services import EmptyPop, pop, pop_generation
from jobs.services.pop import RecentSkips
from tests.conftest import give_kudos, multiply_rows
from workers import messages
from workers.declaration import WorkerDeclaration
from workers.models import Account, Worker

POP = {
    "models": ["m1"],
    "max_length": 512,
    "max_context_length": 2048,
    "threads": 1,
    "nsfw": False,
    "chat": False,
    "tools": False,
    "structured_outputs": False,
    "bridge_agent": "test:1:test",
    "amount": 1,
    "wait_seconds": 0,
}


def _pop(caller, name: str):
    """The service's pop, as the route calls it, with POP's declaration."""
    return pop_generation(api_key=caller.api_key, declaration=WorkerDeclaration(name=name, **POP))


def test_the_first_pop_creates_the_worker_with_what_it_declares(owner):
    owner.pop("fresh", models=["m1", "m2"], max_length=1024, max_context_length=4096, threads=2)
    worker = Worker.objects.get(name="fresh")
    assert worker.account == owner.account
    assert worker.served_models == ["m1", "m2"]
    assert (worker.max_length, worker.max_context_length, worker.threads) == (1024, 4096, 2)


def test_a_name_owned_by_another_account_is_WrongCredentials(owner, make_caller):
    owner.pop("taken")
    thief = make_caller("thief")
    refused = thief.pop("taken")
    assert (refused.status_code, refused.json()["rc"]) == (403, "WrongCredentials")


def _worker_row(name: str) -> tuple:
    """The worker's row version (its ctid changes with every write) and its last pop."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT ctid::text, last_pop_at FROM workers_worker WHERE name = %s", [name])
        return cursor.fetchone()


def test_a_pop_declaring_nothing_new_within_a_tenth_of_the_online_window_writes_nothing(
    owner, time_machine, settings
):
    settings.WORKER_ONLINE_SECONDS = 300
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("steady")
    first = _worker_row("steady")
    time_machine.shift(29)
    assert owner.pop("steady").status_code == 200
    assert _worker_row("steady") == first


def test_a_pop_after_a_tenth_of_the_online_window_records_its_time(owner, time_machine, settings):
    settings.WORKER_ONLINE_SECONDS = 300
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("steady")
    time_machine.shift(31)
    owner.pop("steady")
    assert Worker.objects.get(name="steady").last_pop_at.isoformat() == "2026-01-01T00:00:31+00:00"


@pytest.mark.parametrize(
    "change",
    [
        {"models": ["m1", "m2"]},
        {"max_length": 1024},
        {"max_context_length": 4096},
        {"threads": 2},
        {"nsfw": True},
        {"chat": True},
        {"bridge_agent": "other:2:agent"},
    ],
)
def test_a_pop_declaring_something_new_is_written_at_once(owner, time_machine, change):
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("changing", **{**POP, "models": ["m1"]})
    time_machine.shift(5)
    owner.pop("changing", **{**POP, "models": ["m1"], **change})
    worker = Worker.objects.get(name="changing")
    assert worker.last_pop_at.isoformat() == "2026-01-01T00:00:05+00:00"
    field, value = next(iter(change.items()))
    assert getattr(worker, "served_models" if field == "models" else field) == value


def test_a_recorded_pop_later_than_now_is_written_back_to_now(owner, time_machine):
    time_machine.move_to("2026-01-01 00:01:00+00:00", tick=False)
    owner.pop("traveller")
    time_machine.move_to("2026-01-01 00:00:50+00:00", tick=False)
    owner.pop("traveller")
    assert Worker.objects.get(name="traveller").last_pop_at.isoformat() == "2026-01-01T00:00:50+00:00"


def test_the_anonymous_key_cannot_run_a_worker(anonymous):
    refused = anonymous.pop("anon-worker")
    assert (refused.status_code, refused.json()["rc"]) == (403, "AnonForbiddenWorker")


def test_an_unknown_key_is_InvalidAPIKey(owner):
    owner.api_key = "x" * 22
    refused = owner.pop("w")
    assert (refused.status_code, refused.json()["rc"]) == (401, "InvalidAPIKey")


def test_among_equal_fair_ranks_the_pop_takes_the_highest_priority_then_the_oldest(
    make_caller, owner, time_machine
):
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("w")
    ids = []
    for index in range(3):  # each account's first request: all of fair rank 0
        ids.append(make_caller(f"requester-{index}").request_text(models=["m1"]).json()["id"])
        time_machine.shift(1)
    TextRequest.objects.filter(pk=ids[2]).update(priority=5)
    popped = [Generation.objects.get(pk=owner.pop("w").json()["id"]).request_id for _ in range(3)]
    assert [str(p) for p in popped] == [ids[2], ids[0], ids[1]]


def test_a_requests_fair_rank_is_its_accounts_waiting_or_running_requests_when_queued(requester, owner):
    owner.pop("w")
    first, second = (requester.request_text(models=["m1"]).json()["id"] for _ in range(2))
    assert owner.pop("w").json()["id"]  # the first runs: it still counts
    third = requester.request_text(models=["m1"]).json()["id"]
    ranks = dict(TextRequest.objects.values_list("id", "fair_rank"))
    assert [ranks[uuid.UUID(i)] for i in (first, second, third)] == [0, 1, 2]


def test_after_one_account_queues_a_thousand_another_accounts_request_is_offered_within_two_pops(
    requester, make_caller, owner, settings, time_machine
):
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 2000
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=True)
    owner.pop("w")
    for index in range(1000):
        assert requester.request_text(f"flood {index}", models=["m1"]).status_code == 202
    light = make_caller("light").request_text("mine", models=["m1"]).json()["id"]
    popped = [str(Generation.objects.get(pk=owner.pop("w").json()["id"]).request_id) for _ in range(2)]
    assert light in popped
    # And the heavy account's own requests keep their order among themselves.
    heavy = [str(Generation.objects.get(pk=owner.pop("w").json()["id"]).request.fair_rank) for _ in range(3)]
    assert heavy == sorted(heavy, key=int)


@pytest.mark.parametrize(
    ("request_body", "worker_body", "offered"),
    [
        ({"models": ["m1"]}, {"models": ["m1"]}, True),
        ({"models": ["m2"]}, {"models": ["m1"]}, False),
        ({}, {"models": ["m1"]}, True),
        ({"params": {"max_length": 600}}, {"max_length": 512}, False),
        ({"params": {"max_length": 512}}, {"max_length": 512}, True),
        ({"params": {"max_context_length": 4096}}, {"max_context_length": 2048}, False),
        ({"params": {"max_context_length": 2048}}, {"max_context_length": 4096}, True),
        ({"trusted_workers": True}, {}, False),
    ],
)
def test_the_pop_filters_by_model_length_context_and_trust(
    requester, owner, request_body, worker_body, offered
):
    give_kudos(requester)  # a request of over 512 tokens needs its kudos upfront
    owner.pop("other", models=["m1", "m2"])  # another worker keeps both models known
    worker_body = {"models": ["m1"], **worker_body}
    owner.pop("w", **worker_body)
    assert requester.request_text(**request_body).status_code == 202
    job = owner.pop("w", **worker_body).json()
    assert (job["id"] is not None) is offered


def test_trusted_workers_requests_go_to_trusted_owners(requester, trusted_owner):
    trusted_owner.pop("tw", chat=True)
    requester.request_text(trusted_workers=True)
    job = trusted_owner.pop("tw", chat=True).json()
    assert job["id"] is not None
    assert job["lease"]["cap_seconds"] == 600


def test_a_request_for_named_workers_goes_only_to_them(requester, owner):
    owner.pop("a")
    owner.pop("b")
    b = Worker.objects.get(name="b")
    requester.request_text(workers=[str(b.id)])
    assert owner.pop("a").json()["id"] is None
    assert owner.pop("b").json()["id"] is not None


def test_a_text_worker_never_gets_a_chat_job(requester, owner):
    owner.pop("w")
    request_id = requester.request_text().json()["id"]
    TextRequest.objects.filter(pk=request_id).update(kind=TextRequest.Kind.CHAT)
    assert owner.pop("w").json()["id"] is None
    assert owner.pop("w", chat=True).json()["id"] is not None


def test_the_pop_starts_a_lease_of_the_base_length(requester, owner, time_machine, settings):
    settings.TEXT_JOB_LEASE_SECONDS = 42
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("w", chat=True)
    requester.request_text()
    job = owner.pop("w", chat=True).json()
    assert job["ttl"] == 42
    assert job["lease"]["expires_at"] == "2026-01-01T00:00:42Z"
    generation = Generation.objects.get(pk=job["id"])
    assert (generation.job_ttl, generation.cap_seconds, generation.trusted_at_pop) == (42, 200, False)


def test_the_pop_costs_a_pinned_number_of_queries(requester, owner, django_assert_num_queries):
    owner.pop("w")
    requester.request_text()
    # the key's account with the worker's check-in (one statement), and one statement that
    # locks a request, takes its job and starts the lease.
    with django_assert_num_queries(2):
        assert owner.pop("w").json()["id"] is not None
    # A pop that finds nothing explains why in one more, bounded statement (`skipped`).
    with django_assert_num_queries(3):
        assert owner.pop("w").json()["id"] is None


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_pop_sends_its_plan_setting_with_the_claim(
    requester, owner, django_assert_num_queries
):
    owner.pop("w")
    requester.request_text()
    # The check-in, then the claim with the setting that chooses its plan, in one round trip.
    with django_assert_num_queries(3) as captured:
        assert owner.pop("w").json()["id"] is not None
    assert (
        captured.captured_queries[1]["sql"]
        == "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
    )


@pytest.mark.django_db(transaction=True)
def test_the_claim_is_planned_once_per_connection_not_at_every_pop(owner):
    """At an idle pop PostgreSQL estimates a custom plan cheaper than the generic one, and
    would plan the claim anew at every pop (several times what running it costs)."""
    owner.pop("idle")
    for _ in range(12):  # past psycopg's prepare threshold, on this thread's one connection
        assert isinstance(_pop(owner, "idle"), EmptyPop)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%picked AS%"],
        )
        generic, custom = cursor.fetchone()
        cursor.execute("SHOW plan_cache_mode")
        mode = cursor.fetchone()[0]
    assert (generic > 0, custom) == (True, 0)
    assert mode == "auto"  # the setting ended with the claim


@pytest.mark.django_db(transaction=True)
def test_twenty_threads_popping_a_hundred_requests_take_each_exactly_once(make_caller, settings):
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 100
    requester = make_caller("requester")
    owner = make_caller("owner")
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=21)  # 20 poppers and the warm-up
    owner.pop("warmup")
    for i in range(100):
        requester.request_text(f"prompt {i}")
    taken: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(20)

    def pop_until_empty(n: int) -> None:
        try:
            start.wait()
            while True:
                job = _pop(owner, f"w{n}")
                if isinstance(job, EmptyPop):
                    return
                taken.append(str(job.request.id))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=pop_until_empty, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(taken) == 100
    assert set(Counter(taken).values()) == {1}
    assert set(taken) == {str(pk) for pk in TextRequest.objects.values_list("pk", flat=True)}
    assert Generation.objects.count() == 100
    assert TextRequest.objects.filter(queued__gt=0).count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_first_pops_under_one_name_create_one_worker(make_caller):
    owner = make_caller("owner")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def pop() -> None:
        try:
            start.wait()
            _pop(owner, "same-name")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=pop) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Worker.objects.filter(name="same-name").count() == 1


def test_the_pop_answer_renders_exactly_as_its_schema_serializer_would(requester, owner, time_machine):
    """The view renders `_pop_answer` as is; PopOutput (the schema) must render it the same."""
    from django.utils import timezone

    from jobs import serializers
    from jobs.views import _pop_answer

    time_machine.move_to("2026-08-01 12:00:00.123456+00:00", tick=False)
    owner.pop("w")
    requester.request_text()
    now = timezone.now()
    job = _pop(owner, "w")
    answers = [_pop_answer(job, now, chat=chat) for chat in (True, False)]
    for answer in (*answers, _pop_answer(EmptyPop(skipped={"models": 2}), now, chat=True)):
        as_is = json.loads(JSONRenderer().render(answer))
        assert as_is == json.loads(JSONRenderer().render(serializers.PopOutput(answer).data))
    assert as_is["id"] is None
    rendered = json.loads(JSONRenderer().render(_pop_answer(job, now, chat=True)))
    assert rendered["lease"]["expires_at"] == "2026-08-01T12:02:30.123456Z"


def test_the_pops_generic_plan_walks_each_models_queue_index_without_sorting_the_queue(requester, owner):
    """PostgreSQL keeps a prepared pop's generic plan: it must be the index walks, not a sort."""
    import re

    from psycopg import sql

    from jobs import sql as jobs_sql
    from jobs.services.pop import pop_params

    owner.pop("planned")  # checks the worker in: its model can then be asked for
    assert requester.request_text(models=["m1"]).status_code == 202
    # A queue the size the planner would see in service, of many shapes, and its statistics.
    multiply_rows(TextRequest, 20000, max_length="16 + i % 400", max_context_length="1024 + 512 * (i % 8)")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_queuedmodel")
    worker = Worker.objects.get(name="planned")
    params = {
        **pop_params(worker, trusted=False, now=worker.last_pop_at),
        **{"amount": 1, "job_ttl": 150, "cap_seconds": 200, "capacity": 1200, "capacity_limited": False},
    }
    statement = jobs_sql.claim()
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))  # psycopg's $n order
    with connection.connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(statement, params, prepare=True)
            cursor.execute(
                "SELECT name, parameter_types::text[] FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%picked AS%"],
            )
            name, types = cursor.fetchone()
            values = sql.SQL(", ").join(
                sql.SQL("{}::" + kind).format(sql.Literal(params[param]))
                for param, kind in zip(names, types, strict=True)
            )
            cursor.execute(sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(name), values))
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")
    picking = plan.split("CTE taken")[0]
    assert "$1" in picking  # generic: the worker's values are parameters, not constants
    # Each of the worker's models (and '') walks its first rows on the order index; where
    # they hold no offer, its shapes on the shape index (a skip scan, read from the index
    # alone), then the rows of each shape on the same index, in queue order, to the first
    # offer. Nothing of the queue is read whole, by bitmap, or sorted.
    walks = [line.strip() for line in picking.splitlines() if "jobs_queuedmodel" in line]
    assert [walk.split(" on ")[0] for walk in walks] == [
        "->  Index Scan using queued_model_order",
        "->  Index Only Scan using queued_model_shape",
        "->  Index Only Scan using queued_model_shape",
        "->  Index Scan using queued_model_shape",
    ]
    for table in ("jobs_textrequest", "jobs_queuedmodel"):
        assert f"Seq Scan on {table}" not in picking and f"Bitmap Heap Scan on {table}" not in picking
    # The sorts are of the few candidates (one per model, one per shape), above the walks.
    keys = [line.strip() for line in picking.splitlines() if "Sort Key" in line]
    assert keys == [
        "Sort Key: (near.fair_rank), (near.priority) DESC, (near.created_at)",
        "Sort Key: f.fair_rank, f.priority DESC, f.created_at",
    ]


def test_a_pop_that_finds_nothing_counts_why_the_waiting_requests_passed_it_over(
    requester, owner, make_caller, trusted_owner
):
    owner.pop("picky", models=["m1"], max_length=100, max_context_length=1000)
    trusted_owner.pop("elsewhere", models=["m1", "m2"], max_length=4096)
    requester.request_text(models=["m2"])  # models
    requester.request_text(models=["m1"], params={"max_length": 200})  # max_length
    requester.request_text(models=["m1"], params={"max_length": 50, "max_context_length": 2048})  # context
    elsewhere_id = str(Worker.objects.get(name="elsewhere").id)
    requester.request_text(models=["m1"], workers=[elsewhere_id], params={"max_context_length": 1000})
    requester.request_text(models=["m1"], trusted_workers=True, params={"max_context_length": 1000})
    empty = owner.pop("picky", models=["m1"], max_length=100, max_context_length=1000).json()
    assert empty["id"] is None
    assert empty["skipped"] == {
        "models": 1,
        "max_length": 1,
        "max_context_length": 1,
        "worker_id": 1,
        "untrusted": 1,
    }
    idle = make_caller("idle-owner").pop("idle", models=["m-none"]).json()
    assert idle["skipped"] == {"models": 5}


def test_an_idle_workers_empty_pops_reuse_their_skipped_counts_for_the_cache_seconds(
    requester, owner, trusted_owner, settings, time_machine, django_assert_num_queries, monkeypatch
):
    settings.POP_SKIPPED_CACHE_SECONDS = 10
    monkeypatch.setattr(pop, "recent_skips", RecentSkips())  # no counts of another test's workers
    # The workers' messages are read every 5 s (workers/messages.py): not within these counts.
    monkeypatch.setattr(messages, "SNAPSHOT_SECONDS", 3600)
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("idle", models=["m1"])
    trusted_owner.pop("elsewhere", models=["m2"])  # m2 can be asked for
    assert requester.request_text(models=["m2"]).status_code == 202
    time_machine.shift(10)  # past the counts of the check-in's pop, of an empty queue
    first = owner.pop("idle", models=["m1"]).json()
    assert first["skipped"] == {"models": 1}
    assert requester.request_text(models=["m2"]).status_code == 202
    time_machine.shift(9)
    # Counted 9 s ago: the same counts, in two statements (the key's account with the
    # check-in, and the claim that found nothing).
    with django_assert_num_queries(2):
        assert owner.pop("idle", models=["m1"]).json()["skipped"] == {"models": 1}
    time_machine.shift(1)
    with django_assert_num_queries(3):
        assert owner.pop("idle", models=["m1"]).json()["skipped"] == {"models": 2}


def test_a_worker_that_declares_otherwise_has_its_skipped_counted_afresh(
    requester, owner, trusted_owner, settings, time_machine, monkeypatch
):
    settings.POP_SKIPPED_CACHE_SECONDS = 10
    monkeypatch.setattr(pop, "recent_skips", RecentSkips())
    time_machine.move_to("2026-01-01 00:00:00+00:00", tick=False)
    owner.pop("idle", models=["m1"], max_length=100)
    trusted_owner.pop("elsewhere", models=["m1"], max_length=4096)  # a worker long enough for it
    assert requester.request_text(models=["m1"], params={"max_length": 200}).status_code == 202
    time_machine.shift(10)  # past the counts of the check-in's pop, of an empty queue
    assert owner.pop("idle", models=["m1"], max_length=100).json()["skipped"] == {"max_length": 1}
    time_machine.shift(1)
    # The same worker a second later, now for another model: the request is skipped for that.
    assert owner.pop("idle", models=["m2"], max_length=100).json()["skipped"] == {"models": 1}


def test_the_skipped_cache_forgets_the_least_recently_counted_worker_past_its_size():
    skips = RecentSkips()
    skips.SIZE = 2
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for name in ("a", "b", "c"):
        skips.put((name,), at, {"models": 1})
    assert skips.get(("a",), at, 10) is None
    assert skips.get(("b",), at, 10) == skips.get(("c",), at, 10) == {"models": 1}
    # A clock moved back (a test's, or a corrected host clock) does not serve counts "from the future".
    assert skips.get(("b",), at - timedelta(seconds=1), 10) is None
