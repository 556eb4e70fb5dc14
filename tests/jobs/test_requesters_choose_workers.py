"""A requester's own defences, as the AI Horde applies them: `worker_blacklist` turns `workers`
into a block-list, and `slow_workers: false` keeps a request from workers below 2 tokens/s."""

from tests.conftest import give_kudos
from workers.models import Worker


def _worker(caller, name: str, speed: float | None = None) -> Worker:
    assert caller.pop(name).json()["id"] is None  # checked in, nothing queued yet
    Worker.objects.filter(name=name).update(speed=speed)
    return Worker.objects.get(name=name)


def test_a_blocked_worker_is_offered_nothing_of_the_request_and_the_others_are(requester, owner, make_caller):
    blocked = _worker(owner, "blocked")
    other = make_caller()
    _worker(other, "other")
    queued = requester.request_text(workers=[str(blocked.pk)], worker_blacklist=True)
    assert queued.status_code == 202, queued.json()
    empty = owner.pop("blocked").json()
    assert (empty["id"], empty["skipped"]) == (None, {"worker_id": 1})
    assert other.pop("other").json()["id"] is not None

    # Without the flag the same list allows: only the named worker is offered it.
    requester.request_text(workers=[str(blocked.pk)])
    assert other.pop("other").json()["id"] is None
    assert owner.pop("blocked").json()["id"] is not None


def test_blocking_a_worker_that_does_not_exist_is_accepted(requester):
    answer = requester.request_text(workers=["00000000-0000-0000-0000-000000000001"], worker_blacklist=True)
    assert answer.status_code == 202
    assert (
        requester.request_text(workers=["00000000-0000-0000-0000-000000000001"]).json()["rc"]
        == "WorkerNotFound"
    )
    assert requester.request_text(worker_blacklist="yes").status_code == 400


def test_a_request_that_refuses_slow_workers_skips_workers_below_two_tokens_a_second(
    requester, owner, make_caller
):
    give_kudos(requester)  # refusing slow workers needs the kudos upfront, as on the AI Horde
    _worker(owner, "slow", speed=1.5)
    fast_owner, new_owner = make_caller(), make_caller()
    _worker(fast_owner, "fast", speed=2.0)
    _worker(new_owner, "unmeasured")
    for _ in range(2):
        assert requester.request_text(slow_workers=False).status_code == 202
    empty = owner.pop("slow").json()
    assert (empty["id"], empty["skipped"]) == (None, {"performance": 2})
    assert fast_owner.pop("fast").json()["id"] is not None
    assert new_owner.pop("unmeasured").json()["id"] is not None  # taken as 10 t/s until measured

    requester.request_text()  # slow workers welcome (the default)
    assert owner.pop("slow").json()["id"] is not None
