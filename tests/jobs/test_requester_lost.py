"""A chat request whose follower is gone (its web process died) is cancelled, not served to no one.

The follower is the real one (`jobs.relay_hub.events` on an event loop of the test's, against the
real Redis); its web process dying is its Redis connection being dropped (CLIENT KILL), as the
kernel drops a killed process's sockets.
"""

import asyncio
import threading
import time
from decimal import Decimal
from uuid import UUID

import pytest
from django_redis import get_redis_connection

from jobs import relay, relay_hub
from jobs.models import Ending, Generation, TextRequest
from jobs.services import abort_stale_generations
from kudos import ledger
from tests.conftest import progress, queue_chat

WAIT_SECONDS = 10


def _until(check, message: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


class Following:
    """`relay_hub.events` for one request, on an event loop of its own in a thread: as a web
    process follows a request for its requester."""

    def __init__(self, request_id: UUID) -> None:
        self.request_id = request_id
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.events = relay_hub.events(request_id)
        self.waiting = asyncio.run_coroutine_threadsafe(self._next(), self.loop)

    async def _next(self) -> relay.Event:
        return await anext(self.events)

    def subscribers(self) -> int:
        ((_, count),) = get_redis_connection("default").pubsub_numsub(relay.relay_key(self.request_id))
        return count

    def marked(self) -> bool:
        return bool(get_redis_connection("default").exists(relay.followed_key(self.request_id)))

    def wait_followed(self) -> "Following":
        _until(lambda: self.marked() and self.subscribers() == 1, "the follower did not subscribe")

        async def hub() -> relay_hub._Hub:
            return relay_hub._hubs[asyncio.get_running_loop()]

        self.hub = asyncio.run_coroutine_threadsafe(hub(), self.loop).result(WAIT_SECONDS)
        return self

    def die(self) -> None:
        """Its process's connection to Redis is dropped, as when the process is killed."""
        client = get_redis_connection("default")
        db = str(client.connection_pool.connection_kwargs.get("db", 0))
        hubs = [c for c in client.client_list() if c["name"] == relay_hub.HUB_CLIENT_NAME and c["db"] == db]
        assert hubs, "no relay hub connection"
        for hub in hubs:
            client.client_kill_filter(_id=hub["id"])
        _until(lambda: self.subscribers() == 0, "the dead follower is still subscribed")

    def close(self) -> None:
        self.waiting.cancel()

        async def settle() -> None:
            try:
                await self.events.aclose()
            except Exception:
                pass  # already ended by the kill
            # The hub unsubscribes and closes its connection itself once its last follower left
            # (disconnects, after a kill): no connection of it outlives the test.
            hub = self.hub
            while hub._chores or (hub._listener is not None and not hub._listener.done()):
                await asyncio.sleep(0.02)

        asyncio.run_coroutine_threadsafe(settle(), self.loop).result(WAIT_SECONDS)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_SECONDS)
        self.loop.close()


@pytest.fixture
def following():
    started: list[Following] = []

    def follow(request_id: UUID) -> Following:
        started.append(Following(request_id).wait_followed())
        return started[-1]

    yield follow
    for follower in started:
        follower.close()


def _spent(requester) -> Decimal:
    return -ledger.balance(requester.account.pk)


def _told_cancelled_and_not_charged(answer, request_id: UUID, requester, spent_before: Decimal) -> None:
    """The worker was told to stop; the request ended as the horde losing it, costing nothing."""
    assert answer.status_code == 409, answer.content
    assert answer.json()["rc"] == "GenerationCancelled"
    assert "lost the connection of the requester" in answer.json()["message"]
    text_request = TextRequest.objects.get(pk=request_id)
    assert (text_request.state, text_request.ending) == (TextRequest.State.CANCELLED, Ending.UNAVAILABLE)
    assert text_request.kudos_spent == 0
    assert _spent(requester) == spent_before


@pytest.mark.django_db(transaction=True)
def test_a_follower_is_marked_once_its_subscription_holds_and_gone_once_its_connection_is(
    chat_job, owner, following
):
    job = chat_job(owner)
    request_id = Generation.objects.get(pk=job["id"]).request_id
    assert relay.followers_gone([request_id]) == set()  # not followed yet: not gone
    follower = following(request_id)
    assert relay.followers_gone([request_id]) == set()
    follower.die()
    assert relay.followers_gone([request_id]) == {request_id}


@pytest.mark.django_db(transaction=True)
def test_a_follower_that_leaves_unmarks_its_request_so_it_is_not_taken_for_dead(chat_job, owner):
    job = chat_job(owner)
    request_id = Generation.objects.get(pk=job["id"]).request_id
    follower = Following(request_id).wait_followed()
    follower.close()  # as when its requester leaves: its own step cancels the request
    _until(lambda: follower.subscribers() == 0, "the follower did not unsubscribe")
    assert not follower.marked()
    assert relay.followers_gone([request_id]) == set()
    assert progress(owner, job["id"], 1, "still relayed", tokens=2).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_progress_post_after_the_followers_process_died_is_told_cancelled_and_nothing_is_charged(
    chat_job, owner, requester, following
):
    job = chat_job(owner)
    generation = Generation.objects.get(pk=job["id"])
    follower = following(generation.request_id)
    assert progress(owner, job["id"], 1, "Once upon ", tokens=3).status_code == 200
    before = _spent(requester)
    follower.die()
    answer = progress(owner, job["id"], 2, "a time", tokens=5)
    _told_cancelled_and_not_charged(answer, generation.request_id, requester, before)
    generation.refresh_from_db()
    assert generation.state == Generation.State.CANCELLED
    assert generation.reward > 0  # the worker is paid for what it delivered; the horde lost it


@pytest.mark.django_db(transaction=True)
def test_progress_before_the_follower_subscribes_and_while_it_lives_is_relayed(chat_job, owner, following):
    job = chat_job(owner)
    request_id = Generation.objects.get(pk=job["id"]).request_id
    assert progress(owner, job["id"], 1, "early ", tokens=1).status_code == 200
    follower = following(request_id)
    assert progress(owner, job["id"], 2, "later", tokens=2).status_code == 200
    assert follower.waiting.result(WAIT_SECONDS).text == "early "
    assert TextRequest.objects.get(pk=request_id).state == TextRequest.State.ACTIVE


@pytest.mark.django_db(transaction=True)
def test_a_submit_after_the_followers_process_died_is_refused_and_nothing_is_charged(
    chat_job, owner, requester, following
):
    job = chat_job(owner)
    generation = Generation.objects.get(pk=job["id"])
    follower = following(generation.request_id)
    before = _spent(requester)
    follower.die()
    answer = owner.submit(job["id"], "The whole reply, which nobody waits for.")
    _told_cancelled_and_not_charged(answer, generation.request_id, requester, before)


@pytest.mark.django_db(transaction=True)
def test_the_stale_pass_cancels_a_queued_request_whose_follower_is_gone(owner, requester, following):
    owner.pop("chat-worker", models=["chat-model"], chat=True)  # the model is served: requests queue
    waiting = queue_chat(requester, 64)
    followed = queue_chat(requester, 64)
    alive = queue_chat(requester, 64)
    following(alive.pk)
    following(followed.pk).die()
    # The dead follower's kill dropped the hub both share: the live one follows again.
    survivor = following(alive.pk)
    assert survivor.subscribers() == 1
    result = abort_stale_generations()
    assert result.unfollowed == 1
    states = dict(TextRequest.objects.values_list("pk", "state"))
    assert states[followed.pk] == TextRequest.State.CANCELLED
    assert states[waiting.pk] == states[alive.pk] == TextRequest.State.ACTIVE
    assert TextRequest.objects.get(pk=followed.pk).ending == Ending.UNAVAILABLE
