"""Pops that wait for work (`wait_seconds`, jobs/waits.py): served by the ASGI application in
this process, with its real pub/sub hub on the test Redis and real PostgreSQL."""

import asyncio
import json
import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.db import connection

from hordeops import asgi, asyncdb
from jobs import services, waits
from jobs.models import Generation, TextRequest
from tests.live import Background

POP = "/api/v2/generate/text/pop"


class Client:
    """One HTTP request to the application, whose client can leave (`leave`) while it waits."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.sent: list[dict] = []

    async def post(
        self, path: str, body: dict, api_key: str, headers: dict[str, str] | None = None
    ) -> tuple[int | None, dict | None]:
        raw = json.dumps(body).encode()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"testserver"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
                (b"apikey", api_key.encode()),
                *((name.lower().encode(), value.encode()) for name, value in (headers or {}).items()),
            ],
            "client": ("127.0.0.1", 1234),
            "server": ("testserver", 80),
        }
        read = False

        async def receive():
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await self.left.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            self.sent.append(message)

        await asgi.application(scope, receive, send)
        if not self.sent:
            return None, None
        status = next(m["status"] for m in self.sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return status, json.loads(body)


def pop_body(name: str, *, models=("m1",), wait: float | None = None, **extra) -> dict:
    body = {"name": name, "models": list(models), **extra}
    if wait is not None:
        body["wait_seconds"] = wait
    return body


def queue_text(account, model: str = "m1", n: int = 1, prompt: str = "Once upon a time") -> TextRequest:
    """Queue a text request on a thread of its own, as another web process would."""
    try:
        return services.create_text_request(
            account=account,
            address="",
            prompt=prompt,
            params={"n": n, "max_length": 80, "max_context_length": 1024},
            models=[model],
            workers=[],
            trusted_workers=False,
            slow_workers=True,
            dry_run=False,
        ).request
    finally:
        connection.close()


def run(scenario):
    """Run `scenario` on a new event loop, and close its hub before the loop ends."""

    async def whole():
        try:
            return await scenario()
        finally:
            await waits.stop_waiting()
            await asyncio.sleep(0.05)  # its connection closes

    return asyncio.run(whole())


async def timed_pop(body: dict, api_key: str, client: Client | None = None, headers=None):
    status, answer = await (client or Client()).post(POP, body, api_key, headers)
    return status, answer, time.monotonic()


@pytest.fixture(autouse=True)
def _no_hub_left_open(monkeypatch):
    monkeypatch.setattr(waits, "LINGER_SECONDS", 0.0)


@pytest.mark.django_db(transaction=True)
def test_a_waiting_pop_answers_within_tens_of_milliseconds_of_a_job_it_can_take(requester, owner):
    async def scenario():
        waiting = asyncio.create_task(timed_pop(pop_body("waiter", wait=5), owner.api_key))
        await asyncio.sleep(0.5)
        request = await asyncio.to_thread(queue_text, requester.account)
        queued = time.monotonic()
        status, answer, answered = await waiting
        return request, status, answer, answered - queued

    request, status, answer, after = run(scenario)
    assert status == 200 and answer["id"] is not None
    assert Generation.objects.get(pk=answer["id"]).request_id == request.pk
    assert after < 0.1, after


@pytest.mark.django_db(transaction=True)
def test_a_woken_pop_is_not_held_back_by_chat_steps_filling_their_database_threads(requester, owner):
    # A burst of chats being queued holds every one of the chat routes' database threads (each
    # waits for its account's lock): the pop that would take the first of them runs elsewhere.
    release = threading.Event()

    async def scenario():
        waiting = asyncio.create_task(timed_pop(pop_body("waiter", wait=5), owner.api_key))
        await asyncio.sleep(0.5)
        held = [asyncdb._threads().submit(release.wait, 10) for _ in range(settings.WEB_ASYNC_DB_THREADS)]
        try:
            await asyncio.to_thread(queue_text, requester.account)
            queued = time.monotonic()
            status, answer, answered = await waiting
        finally:
            release.set()
        await asyncio.gather(*(asyncio.wrap_future(hold) for hold in held))
        return status, answer, answered - queued

    status, answer, after = run(scenario)
    assert status == 200 and answer["id"] is not None
    assert after < 0.1, after


def give_back(caller, generation_id: str) -> None:
    try:
        assert caller.submit(generation_id, state="faulted").status_code == 200
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_job_given_back_wakes_a_waiting_worker_that_can_take_it(requester, owner):
    request = queue_text(requester.account)
    taken = owner.pop("first", models=["m1"]).json()

    async def scenario():
        waiting = asyncio.create_task(timed_pop(pop_body("second", wait=5), owner.api_key))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(give_back, owner, taken["id"])
        given_back = time.monotonic()
        _, answer, answered = await waiting
        return answer, answered - given_back

    answer, after = run(scenario)
    generation = Generation.objects.get(pk=answer["id"])
    assert generation.request_id == request.pk and generation.worker.name == "second"
    assert after < 0.1, after


@pytest.mark.django_db(transaction=True)
def test_a_waiting_pop_with_nothing_to_take_answers_the_empty_pop_at_its_end(requester, owner):
    async def scenario():
        await asyncio.to_thread(queue_text, requester.account, "another-model")
        started = time.monotonic()
        status, answer, answered = await timed_pop(pop_body("idle", wait=0.6), owner.api_key)
        return status, answer, answered - started

    status, answer, took = run(scenario)
    assert 0.6 <= took < 1.5, took
    assert status == 200
    assert answer["id"] is None and answer["ids"] == [] and answer["ttl"] is None
    assert answer["skipped"] == {"models": 1}


@pytest.mark.django_db(transaction=True)
def test_a_waiting_worker_that_cannot_take_a_job_is_not_woken_for_it(requester, owner):
    async def scenario():
        m1 = asyncio.create_task(timed_pop(pop_body("serves-m1", wait=1.0), owner.api_key))
        await asyncio.sleep(0.4)
        hub = waits.hub()
        await asyncio.to_thread(queue_text, requester.account, "m2")
        await asyncio.sleep(0.2)
        woken_for_m2 = hub.woken
        _, answer, _ = await m1
        return woken_for_m2, answer

    woken_for_m2, answer = run(scenario)
    assert woken_for_m2 == 0
    assert answer["id"] is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("n", [1, 2])
def test_a_queued_request_wakes_no_more_of_one_workers_slots_than_it_has_jobs(requester, trusted_owner, n):
    async def scenario():
        slots = []
        for _ in range(4):  # one bridge's four slots, each in its own waiting pop
            slots.append(asyncio.create_task(timed_pop(pop_body("slots", wait=1.5), trusted_owner.api_key)))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        hub = waits.hub()
        request = await asyncio.to_thread(queue_text, requester.account, n=n)
        await asyncio.sleep(0.3)
        woken = hub.woken
        answers = [answer for _, answer, _ in await asyncio.gather(*slots)]
        return request, woken, answers

    request, woken, answers = run(scenario)
    assert woken == n  # not n + WAKE_MARGIN: another slot of the same worker pops for nothing
    taken = [answer["id"] for answer in answers if answer["id"]]
    assert len(taken) == n
    assert {Generation.objects.get(pk=job).request_id for job in taken} == {request.pk}


def test_a_slot_in_the_middle_of_a_pop_does_not_stand_for_its_workers_idle_slots():
    # Two jobs queued together: the slot woken for the first is popping when the second's
    # message comes; the worker's other slot must be woken for that one.
    async def scenario():
        hub = waits._Hub(asyncio.get_running_loop())
        slot = dict(
            models=frozenset({"m1"}), chat=False, max_length=80, max_context_length=1024, worker_id="w"
        )
        popping, idle, other = waits.Waiter(**slot), waits.Waiter(**slot), waits.Waiter(**slot)
        popping.popping = True
        hub._waiters = {waiter.order: waiter for waiter in (popping, idle, other)}
        hub._wake(waits.Offer(models=("m1",), chat=False, max_length=80, max_context_length=1024, jobs=1))
        await hub._client.aclose()
        return popping.woken.is_set(), idle.woken.is_set(), other.woken.is_set()

    assert asyncio.run(scenario()) == (True, True, False)


def test_slots_in_the_middle_of_a_pop_do_not_use_up_the_wakes_of_a_job():
    # A burst: every slot woken for an earlier job is still popping when this job's message
    # comes. Waking them (their pops may not see it) must leave a wake for an idle slot, else
    # the job waits for a slot's next pop.
    async def scenario():
        hub = waits._Hub(asyncio.get_running_loop())
        slot = dict(models=frozenset({"m1"}), chat=False, max_length=80, max_context_length=1024)
        popping = [waits.Waiter(**slot, worker_id=f"w{i}") for i in range(1 + waits.WAKE_MARGIN)]
        for waiter in popping:
            waiter.popping = True
        idle = waits.Waiter(**slot, worker_id="w-idle")
        hub._waiters = {waiter.order: waiter for waiter in (*popping, idle)}
        hub._wake(waits.Offer(models=("m1",), chat=False, max_length=80, max_context_length=1024, jobs=1))
        await hub._client.aclose()
        return [waiter.woken.is_set() for waiter in popping], idle.woken.is_set()

    assert asyncio.run(scenario()) == ([True] * (1 + waits.WAKE_MARGIN), True)


@pytest.mark.django_db(transaction=True)
def test_one_workers_slots_waiting_in_two_web_processes_pop_once_for_a_job(
    requester, trusted_owner, monkeypatch
):
    pops: list[str] = []
    pop_generation = services.pop_generation

    def counted(**kwargs):
        pops.append(kwargs["declaration"].name)
        return pop_generation(**kwargs)

    monkeypatch.setattr(services, "pop_generation", counted)
    # Each slot on an event loop of its own, with its own hub and pub/sub connection: as in two
    # web processes.
    slots = [
        Background(lambda: run(lambda: timed_pop(pop_body("slots", wait=1.5), trusted_owner.api_key)))
        for _ in range(2)
    ]
    time.sleep(0.6)
    before = len(pops)  # each slot's first pop, and its pop once its hub had joined the channel
    request = queue_text(requester.account)
    answers = [slot.result()[1] for slot in slots]
    taken = [answer["id"] for answer in answers if answer["id"]]
    assert len(taken) == 1
    assert Generation.objects.get(pk=taken[0]).request_id == request.pk
    # One pop for the job: the other process's slot, woken too, took no ticket.
    assert len(pops) - before == 1, pops


@pytest.mark.django_db(transaction=True)
def test_a_queued_job_wakes_a_bounded_number_of_waiting_workers_oldest_first(requester, trusted_owner):
    names = [f"waiter-{i}" for i in range(5)]

    async def scenario():
        pops = []
        for name in names:  # in this order: the oldest waits longest
            pops.append(asyncio.create_task(timed_pop(pop_body(name, wait=1.5), trusted_owner.api_key)))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        hub = waits.hub()
        request = await asyncio.to_thread(queue_text, requester.account)
        await asyncio.sleep(0.3)
        woken = hub.woken
        answers = [answer for _, answer, _ in await asyncio.gather(*pops)]
        return request, woken, answers

    request, woken, answers = run(scenario)
    assert woken == 1 + waits.WAKE_MARGIN
    taken = [answer["id"] for answer in answers if answer["id"]]
    assert len(taken) == 1
    assert Generation.objects.get(pk=taken[0]).worker.name in names[: 1 + waits.WAKE_MARGIN]
    assert Generation.objects.get(pk=taken[0]).request_id == request.pk


@pytest.mark.django_db(transaction=True)
def test_the_lease_of_a_job_found_by_waiting_starts_at_the_answer_not_at_the_pop(requester, owner):
    body = pop_body("chat-waiter", wait=5, chat=True)

    async def scenario():
        waiting = asyncio.create_task(timed_pop(body, owner.api_key))
        await asyncio.sleep(1.0)
        request = await asyncio.to_thread(queue_text, requester.account)
        _, answer, _ = await waiting
        return request, answer

    request, answer = run(scenario)
    generation = Generation.objects.get(pk=answer["id"])
    assert generation.popped_at >= request.created_at  # the pop arrived a second before
    lease_end = generation.popped_at + timedelta(seconds=settings.TEXT_JOB_LEASE_SECONDS)
    assert answer["lease"]["expires_at"] == lease_end.isoformat().replace("+00:00", "Z")


@pytest.mark.django_db(transaction=True)
def test_a_client_that_leaves_while_its_pop_waits_gets_nothing_popped_for_it(requester, owner):
    async def scenario():
        client = Client()
        waiting = asyncio.create_task(timed_pop(pop_body("leaver", wait=5), owner.api_key, client))
        await asyncio.sleep(0.4)
        client.left.set()
        status, _, _ = await asyncio.wait_for(waiting, 1)
        hub = waits.hub()
        request = await asyncio.to_thread(queue_text, requester.account)
        await asyncio.sleep(0.2)
        return status, request, hub.woken, client.sent

    status, request, woken, sent = run(scenario)
    assert status is None and sent == []  # nothing sent to a client that is gone
    assert woken == 0  # it waits no more
    assert TextRequest.objects.get(pk=request.pk).queued == 1


@pytest.mark.django_db(transaction=True)
def test_without_redis_a_waiting_pop_answers_its_empty_pop_at_once(requester, owner, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/10"  # the hub's only: the cache keeps its own client

    async def scenario():
        started = time.monotonic()
        status, answer, answered = await timed_pop(pop_body("no-redis", wait=5), owner.api_key)
        return status, answer, answered - started

    status, answer, took = run(scenario)
    assert status == 200 and answer["id"] is None
    assert took < 1, took


@pytest.mark.django_db(transaction=True)
def test_a_waiting_pop_answers_by_its_requests_deadline_header(owner):
    async def scenario():
        started = time.monotonic()
        deadline = {"X-MultiLLM-Deadline-Ms": "400"}
        status, answer, answered = await timed_pop(
            pop_body("hurried", wait=5), owner.api_key, headers=deadline
        )
        return status, answer, answered - started

    status, answer, took = run(scenario)
    assert status == 200 and answer["id"] is None
    assert 0.3 <= took < 1.0, took


@pytest.mark.django_db(transaction=True)
def test_a_waiting_pop_answers_at_once_when_its_channel_is_lost(requester, owner):
    async def scenario():
        waiting = asyncio.create_task(timed_pop(pop_body("cut-off", wait=5), owner.api_key))
        await asyncio.sleep(0.5)
        lost = time.monotonic()
        waits.hub().fail()  # as a lost connection to Redis does
        status, answer, answered = await waiting
        return status, answer, answered - lost

    status, answer, after = run(scenario)
    assert status == 200 and answer["id"] is None
    assert after < 0.5, after


@pytest.mark.django_db(transaction=True)
def test_a_pop_that_does_not_ask_to_wait_answers_at_once_and_joins_no_hub(requester, owner):
    async def scenario():
        started = time.monotonic()
        status, answer, answered = await timed_pop(pop_body("plain"), owner.api_key)
        return status, answer, answered - started, asyncio.get_running_loop() in waits._hubs

    status, answer, took, hub_made = run(scenario)
    assert status == 200 and answer["id"] is None
    assert not hub_made
    assert took < 1, took


@pytest.mark.parametrize("wait", [-1, 30.5, 1000, "5", True, None, [1]])
def test_a_wait_outside_0_to_30_seconds_is_refused_with_a_400(owner, wait):
    answer = owner.pop("bad-wait", wait_seconds=wait)
    assert answer.status_code == 400
    assert answer.json()["rc"] == "ValidationError" and "wait_seconds" in answer.json()["errors"]


@pytest.mark.parametrize("wait", [0, 0.5, 30])
def test_a_wait_within_bounds_is_accepted_and_the_test_client_answers_at_once(owner, wait):
    # Only the ASGI handler waits; the test client (as WSGI would) gets the first, empty pop.
    answer = owner.pop("good-wait", wait_seconds=wait)
    assert answer.status_code == 200 and answer.json()["id"] is None


# --- over HTTP, between two uvicorn processes (tests/live.py) -----------------------------------


def live_pop(base_url: str, api_key: str, name: str, wait: float, timeout: float = 15):
    answer = httpx.post(
        f"{base_url}{POP}",
        json=pop_body(name, wait=wait),
        headers={"apikey": api_key},
        timeout=httpx.Timeout(timeout, connect=5),
    )
    return answer, time.monotonic()


def live_queue(base_url: str, api_key: str) -> float:
    answer = httpx.post(
        f"{base_url}/api/v2/generate/text/async",
        json={"prompt": "Once upon a time", "models": ["m1"], "params": {"max_length": 80}},
        headers={"apikey": api_key},
        timeout=15,
    )
    assert answer.status_code == 202, answer.text
    return time.monotonic()


@pytest.mark.django_db(transaction=True)
def test_a_pop_waiting_on_one_web_process_gets_a_job_queued_on_another(live_stack, requester, owner):
    waiting_on, queued_on = live_stack.urls
    waiting = Background(live_pop, waiting_on, owner.api_key, "live-waiter", 5)
    time.sleep(1.0)
    queued = live_queue(queued_on, requester.api_key)
    answer, answered = waiting.result()
    assert answer.status_code == 200 and answer.json()["id"] is not None
    assert answered - queued < 0.1, answered - queued


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_hangs_up_while_its_pop_waits_is_popped_nothing(live_stack, requester, owner):
    waiting_on, queued_on = live_stack.urls
    with pytest.raises(httpx.ReadTimeout):
        live_pop(waiting_on, owner.api_key, "hangs-up", 5, timeout=0.8)
    time.sleep(0.3)  # the web process reads the disconnect
    live_queue(queued_on, requester.api_key)
    time.sleep(0.5)
    assert not Generation.objects.exists()
    assert TextRequest.objects.get().queued == 1


def _served_turn(requester, owner, prompt: str, reply: str) -> None:
    """The worker "warm" serves a turn of `prompt` (with `reply`), and is remembered for it."""
    assert owner.pop("warm").json()["id"] is None  # online
    queue_text(requester.account, prompt=prompt)
    job = owner.pop("warm").json()["id"]
    assert owner.submit(job, reply).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_follow_up_wakes_its_warm_worker_though_others_waited_longer(requester, owner, settings):
    settings.WARM_WORKER_SECONDS = 2
    _served_turn(requester, owner, "Once upon a time", " there was a king.")

    async def scenario():
        early = [
            asyncio.create_task(timed_pop(pop_body(f"early-{i}", wait=1.5), owner.api_key)) for i in range(2)
        ]
        await asyncio.sleep(0.2)
        warm = asyncio.create_task(timed_pop(pop_body("warm", wait=1.5), owner.api_key))
        await asyncio.sleep(0.3)
        request = await asyncio.to_thread(
            queue_text, requester.account, prompt="Once upon a time there was a king. Then?"
        )
        queued = time.monotonic()
        _, answer, answered = await warm
        others = [answer for _, answer, _ in await asyncio.gather(*early)]
        return request, answer, answered - queued, others

    request, answer, seconds, others = run(scenario)
    assert request.preferred_worker is not None
    assert Generation.objects.get(pk=answer["id"]).worker.name == "warm"
    assert seconds < 0.5
    assert all(other["id"] is None for other in others)


@pytest.mark.django_db(transaction=True)
def test_a_follow_up_its_warm_worker_does_not_take_wakes_the_others_when_its_window_ends(
    requester, owner, settings
):
    settings.WARM_WORKER_SECONDS = 0.5
    _served_turn(requester, owner, "Once upon a time", " there was a king.")

    async def scenario():
        waiting = asyncio.create_task(timed_pop(pop_body("other", wait=5), owner.api_key))
        await asyncio.sleep(0.3)
        request = await asyncio.to_thread(
            queue_text, requester.account, prompt="Once upon a time there was a king. Then?"
        )
        queued = time.monotonic()
        _, answer, answered = await waiting
        return request, answer, answered - queued

    request, answer, seconds = run(scenario)
    assert request.preferred_worker is not None  # the warm worker was free, but does not pop
    assert Generation.objects.get(pk=answer["id"]).worker.name == "other"
    assert 0.4 < seconds < 1.5  # at its window's end, not the wait's (5 s)


def test_a_queued_job_is_announced_only_on_its_own_redis_databases_channel(
    db, settings, django_capture_on_commit_callbacks
):
    """Pub/sub is server-wide: a stack on another database of the same Redis server must not
    hear this one's offers (its pops would wake and pop for nothing)."""
    from django_redis import get_redis_connection

    client = get_redis_connection("default")
    ours, theirs = client.pubsub(), client.pubsub()
    ours.subscribe(waits.channel())
    settings.REDIS_DB += 1
    theirs.subscribe(waits.channel())
    settings.REDIS_DB -= 1
    for listener in (ours, theirs):
        assert listener.get_message(timeout=2)["type"] == "subscribe"
    with django_capture_on_commit_callbacks(execute=True):
        waits.publish([waits.Offer(models=("m",), chat=True, max_length=80, max_context_length=1024, jobs=1)])
    heard = ours.get_message(timeout=2)
    assert heard is not None and json.loads(heard["data"])[0] == ["m"]
    assert theirs.get_message(timeout=0.2) is None
    ours.close()
    theirs.close()
