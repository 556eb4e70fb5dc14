"""POST /api/v2/workers/goodbye: a stopping worker is offline at once wherever online matters,
not for the rest of WORKER_ONLINE_SECONDS after its last pop, and its next pop brings it back."""

from datetime import timedelta

import pytest

from jobs.models import Generation
from kudos.uptime import pay_uptime
from tests.conftest import queue_chat
from workers.models import Worker

T0 = "2026-03-01 12:00:00+00:00"
MODEL = "chat-model"
DECLARED = {"models": [MODEL], "chat": True, "max_length": 16384, "max_context_length": 32768}


def _goodbye(caller, name: str):
    return caller.post("/api/v2/workers/goodbye", {"name": name})


def _worker(caller, name: str, speed: float | None = None) -> Worker:
    assert caller.pop(name, **DECLARED).status_code == 200
    Worker.objects.filter(name=name).update(speed=speed)
    return Worker.objects.get(name=name)


def _v1(caller, path: str, body: dict | None = None):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {caller.api_key}"}
    if body is None:
        return caller.client.get(path, **auth)
    return caller.client.post(path, body, content_type="application/json", **auth)


def test_a_worker_that_says_goodbye_is_offline_at_once_wherever_online_matters(requester, owner, clock):
    worker = _worker(owner, "leaving")
    assert [w["name"] for w in owner.client.get("/api/v2/workers").json()] == ["leaving"]  # now cached
    assert [m["id"] for m in _v1(requester, "/v1/models").json()["data"]] == [MODEL]

    answer = _goodbye(owner, "leaving")

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"id": str(worker.pk), "name": "leaving", "online": False}
    # The same instant: nothing of the 300 s window after its last pop is left.
    assert owner.client.get("/api/v2/workers/name/leaving").json()["online"] is False
    assert owner.client.get("/api/v2/workers").json() == []
    assert _v1(requester, "/v1/models").json()["data"] == []
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    refused = _v1(requester, "/v1/chat/completions", chat)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert requester.client.get("/api/v2/status/models?type=text").json() == []
    assert requester.client.get("/api/v2/status/performance").json()["text_worker_count"] == 0


def test_a_faster_worker_that_said_goodbye_no_longer_holds_back_the_slower_ones(
    requester, owner, trusted_owner, clock
):
    _worker(trusted_owner, "fast", 1000)
    _worker(owner, "slow", 10)
    job = queue_chat(requester, 1500)  # beyond the slow worker's 1200 tokens of capacity
    assert owner.pop("slow", **DECLARED).json()["id"] is None  # it waits for the capable one

    assert _goodbye(trusted_owner, "fast").status_code == 200

    generation = Generation.objects.get(pk=owner.pop("slow", **DECLARED).json()["id"])
    assert generation.request_id == job.id and generation.fallback_tier == 2


def test_a_worker_that_said_goodbye_earns_no_more_uptime(trusted_owner, clock):
    _worker(trusted_owner, "leaving")
    pay_uptime(now=Worker.objects.get().last_pop_at)
    assert Worker.objects.get().uptime_paid_until is not None  # counted
    clock.shift(60)

    _goodbye(trusted_owner, "leaving")
    clock.shift(60)
    pay_uptime(now=Worker.objects.get().last_pop_at + timedelta(seconds=120))

    assert Worker.objects.get().uptime_paid_until is None  # no longer counted


def test_its_next_pop_brings_it_back_in_the_pops_pinned_queries(
    requester, owner, clock, django_assert_num_queries
):
    _worker(owner, "returning")
    _goodbye(owner, "returning")
    requester.request_text(models=[MODEL])
    clock.shift(1)  # well within the check-in's debounce: the pop writes all the same
    with django_assert_num_queries(2):
        assert owner.pop("returning", **DECLARED).json()["id"] is not None
    worker = Worker.objects.get()
    assert worker.left_at is None
    assert owner.client.get("/api/v2/workers/name/returning").json()["online"] is True


def test_a_goodbye_said_twice_keeps_the_first_ones_time(owner, clock):
    _worker(owner, "leaving")
    assert _goodbye(owner, "leaving").status_code == 200
    left_at = Worker.objects.get().left_at
    clock.shift(30)
    again = _goodbye(owner, "leaving")
    assert again.status_code == 200 and again.json()["online"] is False
    assert Worker.objects.get().left_at == left_at


@pytest.mark.parametrize(
    ("who", "body", "status", "rc"),
    [
        ("stranger", {"name": "leaving"}, 403, "WrongCredentials"),
        ("owner", {"name": "nobody-by-that-name"}, 404, "WorkerNotFound"),
        ("owner", {}, 400, "ValidationError"),
        ("owner", {"name": 7}, 400, "ValidationError"),
        ("nobody", {"name": "leaving"}, 401, "InvalidAPIKey"),
        ("anonymous", {"name": "leaving"}, 403, "AnonForbiddenWorker"),
    ],
)
def test_only_the_owners_key_naming_its_worker_says_goodbye(
    owner, make_caller, anonymous, who, body, status, rc
):
    _worker(owner, "leaving")
    caller = {"owner": owner, "stranger": make_caller("stranger"), "anonymous": anonymous}.get(who)
    if caller is None:
        answer = owner.client.post("/api/v2/workers/goodbye", body, format="json")
    else:
        answer = caller.post("/api/v2/workers/goodbye", body)
    assert answer.status_code == status, answer.content
    assert answer.json()["rc"] == rc and answer.json()["message"]
    assert Worker.objects.get().is_online(Worker.objects.get().last_pop_at)  # still online
