"""`jobs.relay_hub`: every followed request of a process rides one pub/sub connection to Redis.

The hub is driven directly on an event loop of the test, against the real Redis; events are
published as the web routes publish them (`relay.publish`, and the lease script through
`relay.APPEND_LUA`).
"""

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.exceptions
from django_redis import get_redis_connection

from hordeops import errors
from jobs import relay, relay_hub

WAIT_SECONDS = 10


def _hub_clients() -> list[dict]:
    """This test's relay hub connections: another stack's on the same Redis server use another
    database, and are not counted."""
    client = get_redis_connection("default")
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    return [c for c in client.client_list() if c["name"] == relay_hub.HUB_CLIENT_NAME and c["db"] == db]


async def _next(events: AsyncIterator[relay.Event]) -> relay.Event:
    return await asyncio.wait_for(anext(events), WAIT_SECONDS)


async def _settle() -> None:
    """Let the hubs' own tasks (unsubscribe, close) finish, so that the loop ends with none open."""
    hubs = list(relay_hub._hubs.values())
    for _ in range(250):
        if all(not hub._chores and (hub._listener is None or hub._listener.done()) for hub in hubs):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the relay hub did not close")


def test_one_connection_carries_the_events_of_many_followed_requests_each_to_its_own():
    requests = [uuid.uuid4() for _ in range(50)]

    async def follow_all() -> None:
        followers = [relay_hub.events(request_id) for request_id in requests]
        first = [asyncio.ensure_future(_next(events)) for events in followers]
        await asyncio.sleep(0.2)  # every follower subscribed and waiting
        assert len(_hub_clients()) == 1
        for index, request_id in enumerate(requests):
            relay.publish(request_id, "delta", "g", text=f"to {index}", seq=1)
        for index, pending in enumerate(first):
            event = await pending
            assert (event.type, event.text, event.fields["seq"]) == ("delta", f"to {index}", "1")
        for events in followers:
            await events.aclose()
        await _settle()

    asyncio.run(follow_all())
    assert not relay_hub._hubs
    assert _hub_clients() == []  # the last follower gone, the hub closed its connection


def test_a_follower_reads_the_backlog_then_live_events_with_no_gap_and_no_repeat():
    request_id = uuid.uuid4()
    for seq in (1, 2, 3):
        relay.publish(request_id, "delta", "g", text=str(seq), seq=seq)

    async def follow() -> list[str]:
        events = relay_hub.events(request_id)
        seen = [(await _next(events)).text for _ in range(3)]
        for seq in (4, 5):
            relay.publish(request_id, "delta", "g", text=str(seq), seq=seq)
        seen += [(await _next(events)).text for _ in range(2)]
        relay.publish(request_id, relay.DONE, "g", text="12345")
        done = await _next(events)
        await events.aclose()
        await _settle()
        return [*seen, done.type]

    assert asyncio.run(follow()) == ["1", "2", "3", "4", "5", "done"]


def test_followers_that_join_while_events_pour_in_see_every_event_once_in_order():
    request_id = uuid.uuid4()
    total = 400
    stop = threading.Event()

    def pour() -> None:
        for seq in range(1, total + 1):
            if stop.is_set():
                return
            relay.publish(request_id, "delta", "g", text=str(seq), seq=seq)

    async def join_midway() -> list[list[int]]:
        publisher = threading.Thread(target=pour)
        publisher.start()
        seen: list[list[int]] = []
        try:
            for _ in range(8):  # one joins every few milliseconds, as events keep coming
                await asyncio.sleep(0.005)
                seen.append([])
                asyncio.ensure_future(_collect(relay_hub.events(request_id), seen[-1], total))
            await asyncio.to_thread(publisher.join, WAIT_SECONDS)
            for _ in range(200):
                if all(len(s) == total for s in seen):
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
        await asyncio.sleep(0.1)  # the collectors close their followers
        await _settle()
        return seen

    for sequence in asyncio.run(join_midway()):
        assert sequence == list(range(1, total + 1))


async def _collect(events: AsyncIterator[relay.Event], into: list[int], total: int) -> None:
    try:
        while len(into) < total:
            into.append(int((await _next(events)).text))
    finally:
        await events.aclose()


def test_a_request_followed_again_just_after_its_last_follower_left_still_gets_its_events():
    request_id = uuid.uuid4()
    others = [uuid.uuid4() for _ in range(3)]

    async def leave_and_return() -> str:
        keep = [relay_hub.events(other) for other in others]  # the hub stays open meanwhile
        pending = [asyncio.ensure_future(_next(events)) for events in keep]
        for _ in range(20):
            events = relay_hub.events(request_id)
            waiting = asyncio.ensure_future(_next(events))
            await asyncio.sleep(0)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await events.aclose()
        events = relay_hub.events(request_id)
        waiting = asyncio.ensure_future(_next(events))
        await asyncio.sleep(0.1)
        relay.publish(request_id, "delta", "g", text="still here", seq=1)
        text = (await waiting).text
        await events.aclose()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for events in keep:
            await events.aclose()
        await _settle()
        return text

    assert asyncio.run(leave_and_return()) == "still here"
    assert not relay_hub._hubs


def test_a_lost_connection_ends_every_follower_with_a_redis_error_and_the_next_follower_reconnects():
    requests = [uuid.uuid4() for _ in range(3)]

    async def lose_connection() -> str:
        followers = [relay_hub.events(request_id) for request_id in requests]
        pending = [asyncio.ensure_future(_next(events)) for events in followers]
        await asyncio.sleep(0.2)
        [hub_client] = _hub_clients()
        get_redis_connection("default").client_kill_filter(_id=hub_client["id"])
        for task in pending:
            with pytest.raises(redis.exceptions.RedisError):
                await task
        for events in followers:
            await events.aclose()

        again = uuid.uuid4()
        events = relay_hub.events(again)
        waiting = asyncio.ensure_future(_next(events))
        await asyncio.sleep(0.1)
        relay.publish(again, "delta", "g", text="after the outage", seq=1)
        text = (await waiting).text
        await events.aclose()
        await _settle()
        return text

    assert asyncio.run(lose_connection()) == "after the outage"


def _types(request_id: uuid.UUID) -> list[str]:
    entries = get_redis_connection("default").xrange(relay.relay_key(request_id))
    return [fields[b"type"].decode() for _id, fields in entries]


def test_events_published_after_redis_lost_its_scripts_are_each_appended_once():
    request_id = uuid.uuid4()
    get_redis_connection("default").script_flush()
    relay.publish_many(
        [(request_id, "delta", "g", {"text": "a", "seq": "1"}), (request_id, relay.DONE, "g", {"text": "a"})]
    )
    relay.publish(request_id, relay.FAILED, code="cancelled")  # the script is loaded now
    assert _types(request_id) == ["delta", "done", "failed"]


def _commands_sent(action) -> list[str]:
    """The commands `action` sends to this test's Redis database, as MONITOR sees them: another
    run on the same server (another database) is not counted, as a server-wide count would."""
    client = get_redis_connection("default")
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    marker = f"end-{uuid.uuid4().hex}"
    seen: list[str] = []
    with client.monitor() as monitor:
        action()
        client.echo(marker)
        for command in monitor.listen():
            if command["db"] != db:
                continue
            if marker in command["command"]:
                return seen
            seen.append(command["command"].split(" ", 1)[0].upper())
    return seen


def test_a_publish_is_one_round_trip_with_no_script_check():
    relay.publish(uuid.uuid4(), relay.FAILED, code="warm")  # loads the script if it was missing
    events = [(uuid.uuid4(), relay.FAILED, "", {"code": "cancelled"}) for _ in range(3)]
    sent = _commands_sent(lambda: relay.publish_many(events))
    assert sent.count("EVALSHA") == 3, sent
    assert not any(name.startswith("SCRIPT") for name in sent), sent


def test_a_stopping_process_fails_its_followers_and_takes_no_new_one(monkeypatch):
    monkeypatch.setattr(relay_hub, "_stopping", False)  # put back for the tests after this one
    request_id = uuid.uuid4()
    relay.publish(request_id, "delta", "g", text="before", seq=1)

    async def stop_while_following() -> tuple[str, type, type]:
        events = relay_hub.events(request_id)
        first = (await _next(events)).text
        waiting = asyncio.ensure_future(_next(events))
        await asyncio.sleep(0.1)
        await relay_hub.stop_following()
        with pytest.raises(errors.ServerStopping) as followed:
            await waiting
        with pytest.raises(errors.ServerStopping) as newcomer:
            await _next(relay_hub.events(uuid.uuid4()))
        await _settle()
        return first, followed.type, newcomer.type

    assert asyncio.run(stop_while_following()) == ("before", errors.ServerStopping, errors.ServerStopping)
