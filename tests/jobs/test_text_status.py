"""GET /api/v2/generate/text/status/{id}: queue_position and wait_time as the AI Horde gives them."""

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
