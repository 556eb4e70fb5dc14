"""A read replica (DATABASE_REPLICA_URL): a real hot standby streaming from a cluster of the
test's own. The discovery routes read it; the pop, the submit and the queueing read the
primary. With the replica's replay paused, the routes that read it show the horde as it was."""

import time

import httpx
import pytest
from django.core.cache import cache

from jobs import discovery
from workers import details


def _models(client: httpx.Client) -> set[str]:
    cache.delete_many(discovery.CACHE_KEYS)  # the routes' own cache (2 s), shared through Redis
    return {model["name"] for model in client.get("/api/v2/status/models?type=text").json()}


def _workers(client: httpx.Client) -> set[str]:
    cache.delete(details.ONLINE_LIST_KEY)
    return {worker["name"] for worker in client.get("/api/v2/workers?type=text").json()}


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_discovery_reads_the_replica_while_the_pop_and_the_submit_read_the_primary(
    private_postgres, streaming_replica, live_stack, monkeypatch
):
    requester = private_postgres.create_account("replica-requester")
    owner = private_postgres.create_account("replica-owner")
    monkeypatch.setenv("MODERATOR_PASSWORD", "a moderator's long password")
    private_postgres.manage("create_moderator", "replica-mod")
    with httpx.Client(base_url=live_stack.urls[0], timeout=15) as client:

        def pop(name: str, model: str) -> dict:
            answer = client.post(
                "/api/v2/generate/text/pop", headers={"apikey": owner}, json={"name": name, "models": [model]}
            )
            assert answer.status_code == 200, answer.text
            return answer.json()

        pop("seen-before", "model-a")
        streaming_replica.caught_up()
        assert "model-a" in _models(client)

        streaming_replica.sql("SELECT pg_wal_replay_pause()")
        pop("seen-after", "model-b")
        # The primary has it; the replica, paused, does not: the discovery routes read the replica.
        assert "model-b" not in _models(client)
        assert "seen-after" not in _workers(client) and "seen-before" in _workers(client)
        # So do the admin's lists; logging in reads the primary (sessions and users always do).
        client.get("/admin/login/")
        logged_in = client.post(
            "/admin/login/?next=/admin/",
            data={
                "username": "replica-mod",
                "password": "a moderator's long password",
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
                "next": "/admin/",
            },
        )
        assert logged_in.status_code == 302, logged_in.text
        listed = client.get("/admin/workers/worker/").text
        assert "seen-before" in listed and "seen-after" not in listed

        # Queueing, the pop and the submit decide on the primary, replica or not.
        queued = client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": requester},
            json={"prompt": "Hi", "models": ["model-b"]},
        )
        assert queued.status_code == 202, queued.text
        job = pop("seen-after", "model-b")
        assert job["id"] is not None
        done = client.post(
            "/api/v2/generate/text/submit",
            headers={"apikey": owner},
            json={"id": job["id"], "generation": "Hello."},
        )
        assert done.status_code == 200, done.text
        status = client.get(f"/api/v2/generate/text/status/{queued.json()['id']}").json()
        assert status["done"] is True  # the requester's status reads the primary too

        streaming_replica.sql("SELECT pg_wal_replay_resume()")
        streaming_replica.caught_up()
        assert "model-b" in _models(client)

        # The replica gone: the same routes answer from the primary, at once.
        streaming_replica.stop()
        started = time.monotonic()
        assert "model-b" in _models(client)
        assert "seen-after" in _workers(client)
        assert "seen-after" in client.get("/admin/workers/worker/").text
        assert time.monotonic() - started < 10
    live_stack.assert_alive()


def test_the_router_sends_reads_to_the_replica_only_where_allowed_and_not_after_a_write(db, monkeypatch):
    from django.contrib.sessions.models import Session
    from django.db import connections, router

    from hordeops import replica
    from workers.models import Worker

    assert replica.alias() == "default"  # no replica configured: everything on the primary
    monkeypatch.setitem(connections.settings, "replica", dict(connections.settings["default"]))
    assert router.db_for_read(Worker) == "default"  # outside a route that allows it
    with replica.reads():
        assert router.db_for_read(Worker) == "replica"
        assert router.db_for_read(Session) == "default"  # who the caller is: the primary's
        Worker.objects.filter(name="nobody").update(info="written")  # a write...
        assert router.db_for_read(Worker) == "default"  # ...and the request reads its own writes
    with replica.reads():
        assert router.db_for_read(Worker) == "replica"  # the next request starts afresh
    assert router.db_for_write(Worker) == "default"
    assert router.allow_migrate("replica", "workers") is False
