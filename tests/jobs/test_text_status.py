"""GET /api/v2/generate/text/status/{id}: queue_position and wait_time as the AI Horde gives them."""

from tests.conftest import multiply_rows
from workers.models import Worker


def test_the_queue_position_counts_from_one_and_is_zero_once_nothing_waits(requester, owner):
    owner.pop("w", models=["m1"])
    first = requester.request_text(models=["m1"]).json()["id"]
    second = requester.request_text(models=["m1"]).json()["id"]
    assert requester.status(first).json()["queue_position"] == 1
    assert requester.status(second).json()["queue_position"] == 2
    owner.pop("w", models=["m1"])  # takes the first
    assert requester.status(first).json()["queue_position"] == 0
    assert requester.status(second).json()["queue_position"] == 1


def test_the_wait_time_comes_from_the_eligible_workers_speed_or_else_the_fleets(requester, owner):
    owner.pop("fast", models=["m1"], threads=2)
    Worker.objects.filter(name="fast").update(speed=10.0)
    served = requester.request_text(models=["m1"], params={"max_length": 100}).json()["id"]
    assert requester.status(served).json()["wait_time"] == 5  # 100 tokens / (2 threads x 10 t/s)
    # Nobody serves this model: estimated from the online fleet, not 0.
    orphan = requester.request_text(models=["nobody"], params={"max_length": 100}).json()["id"]
    status = requester.status(orphan).json()
    assert (status["eligible_workers"], status["queue_position"]) == (0, 2)
    assert status["wait_time"] == 10  # 2 requests x 100 tokens / (2 threads x 10 t/s)


def test_with_no_worker_online_the_wait_is_the_queued_tokens_at_one_a_second(requester):
    request_id = requester.request_text(models=["nobody"], params={"max_length": 64}).json()["id"]
    assert requester.status(request_id).json()["wait_time"] == 64


def test_past_the_markers_the_position_counts_from_the_last_one_before_the_request(
    requester, owner, monkeypatch
):
    from jobs import status

    monkeypatch.setattr(status, "POSITION_MARKER_EVERY", 3)
    owner.pop("w", models=["m1"])
    ids = [requester.request_text(models=["m1"]).json()["id"] for _ in range(10)]
    assert [requester.status(i).json()["queue_position"] for i in ids] == list(range(1, 11))
    assert len(status._position_markers()) == 3  # the 3rd, 6th and 9th
    owner.pop("w", models=["m1"])
    owner.pop("w", models=["m1"])
    # Read from the markers of before the two pops: off by at most what the queue did since.
    later = [requester.status(i).json()["queue_position"] for i in ids[2:]]
    assert all(0 <= p - exact <= 2 for p, exact in zip(later, range(1, 9), strict=True)), later
    from django.core.cache import cache

    cache.delete(status.POSITION_MARKERS_KEY)  # as when they expire, 2 s later
    assert [requester.status(i).json()["queue_position"] for i in ids[2:]] == list(range(1, 9))


def test_the_position_is_counted_on_an_index_range_of_a_long_queue(requester, owner):
    from django.db import connection

    from jobs import sql
    from jobs.models import TextRequest

    owner.pop("w", models=["m1"])
    assert requester.request_text(models=["m1"]).status_code == 202
    multiply_rows(TextRequest, 20000)
    with connection.cursor() as cursor:
        newest = TextRequest.objects.order_by("-created_at", "-id").first()
        marker = TextRequest.objects.order_by("created_at", "id")[15000]
        cursor.execute(
            "EXPLAIN " + sql.queued_between(),
            {
                "request": newest.pk,
                "after_rank": marker.fair_rank,
                "after_priority": -marker.priority,
                "after_created": marker.created_at,
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "using request_queue_position" in plan, plan
    assert "Seq Scan on jobs_textrequest" not in plan, plan


def test_the_eligible_workers_of_a_request_naming_models_are_found_on_the_models_index(requester, owner):
    from django.db import connection
    from django.utils import timezone

    from jobs import eligibility, sql

    owner.pop("w", models=["m1"])
    multiply_rows(Worker, 2000, name="'copy-' || i", served_models="ARRAY['m' || (random() * 200)::int]")
    with connection.cursor() as cursor:
        request_id = requester.request_text(models=["m1"]).json()["id"]
        statement = sql.eligible_workers(names_models=True)
        cursor.execute("EXPLAIN " + statement, {**eligibility.params(timezone.now()), "request": request_id})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Bitmap Index Scan on worker_models_gin" in plan, plan
