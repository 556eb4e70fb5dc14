"""PostgreSQL under Patroni (docs/examples/patroni.yml, three nodes, synchronous_mode) reached
through the libpq multi-host URLs of docs/examples/database.env: the primary is killed (Patroni
and PostgreSQL, SIGKILL), Patroni promotes its synchronous standby, and the web app follows it.
What was accepted before the kill is there after it, a job a worker held is accepted, a stream
that was relaying goes on to its end, and the kudos ledger balances."""

import json
import os
import subprocess
import sys
import time

import httpx
from django.conf import settings
from django.db import connection

from tests.live import (
    ROOT,
    STARTUP_TIMEOUT_SECONDS,
    Background,
    ChatWorker,
    LiveStack,
    _start_server,
    _wait_until_up,
)


def _until(check, *, seconds: float) -> float:
    """Poll `check` until it is true; the seconds it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "not within the time allowed"
        time.sleep(0.1)
    return time.monotonic() - started


def test_the_primary_killed_loses_no_accepted_request_and_the_horde_follows_the_new_one(
    patroni_cluster, transactional_db, make_caller
):
    requester, owner = make_caller("patroni-requester"), make_caller("patroni-owner")
    env = {
        **os.environ,
        "DATABASE_URL": patroni_cluster.url,
        "DATABASE_REPLICA_URL": patroni_cluster.replica_url,
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONUNBUFFERED": "1",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "KEY_RATE_PER_SECOND": "0",
        "ADDRESS_RATE_PER_SECOND": "0",
    }
    # The web process starts while the leader is given the migrated test database (with the two
    # accounts) and the replicas copy it.
    stack = LiveStack([_start_server(env)])
    try:
        patroni_cluster.load(connection.settings_dict)
        patroni_cluster.wait(patroni_cluster.healthy)
        _wait_until_up(stack.servers[0], time.monotonic() + STARTUP_TIMEOUT_SECONDS)
        with httpx.Client(base_url=stack.urls[0], timeout=15) as client:

            def call(method: str, path: str, key: str, body: dict | None = None) -> httpx.Response:
                return client.request(method, path, headers={"apikey": key}, json=body)

            def submit(job_id: str, text: str) -> httpx.Response:
                body = {"id": job_id, "generation": text}
                return call("POST", "/api/v2/generate/text/submit", owner.api_key, body)

            def queue(prompt: str) -> httpx.Response:
                body = {"prompt": prompt, "models": ["m1"]}
                return call("POST", "/api/v2/generate/text/async", requester.api_key, body)

            def pop() -> dict:
                body = {"name": "w", "models": ["m1"]}
                answer = call("POST", "/api/v2/generate/text/pop", owner.api_key, body)
                assert answer.status_code == 200, answer.text
                return answer.json()

            first = queue("Held through the failover.")
            assert first.status_code == 202, first.text
            held = pop()["id"]
            assert held is not None
            acknowledged = queue("Acknowledged before the failover.")
            assert acknowledged.status_code == 202, acknowledged.text

            # A chat reply streaming when the primary dies: its state is in Redis.
            chat = ChatWorker(stack.urls[0], owner.api_key, name="chat-w", model="chat-model")
            assert chat.pop()["id"] is None  # checks in with its model
            first_words = Background(lambda: (chat.pop_job(), chat.progress("Hello").status_code))
            body = {"model": "chat-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
            headers = {"Authorization": f"Bearer {requester.api_key}"}
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as streamed:
                lines = streamed.iter_lines()
                received = []
                while not any("Hello" in line for line in received):
                    received.append(next(lines))
                assert first_words.result()[1] == 200

                old = patroni_cluster.leader()
                patroni_cluster.kill(old)
                killed = time.monotonic()
                others = [name for name in patroni_cluster.names if name != old]

                # Calls are refused (503) until the new primary answers, then taken.
                refused = []

                def taken(answer: httpx.Response) -> bool:
                    assert answer.status_code in (200, 503), answer.text
                    if answer.status_code == 503:
                        refused.append(time.monotonic())
                    return answer.status_code == 200

                _until(lambda: taken(chat.progress(" again.", seq=2)), seconds=30)
                served_again = time.monotonic() - killed
                new = patroni_cluster.leader(others)
                assert new in others
                assert chat.submit("Hello again.").status_code == 200
                received.extend(line for line in lines if line)
            deltas = [
                json.loads(line[6:])["choices"][0]["delta"].get("content")
                for line in received
                if line.startswith("data: {") and json.loads(line[6:])["choices"]
            ]
            assert "".join(d for d in deltas if d) == "Hello again." and received[-1] == "data: [DONE]"

            # The job held through it is accepted; what was acknowledged is there and served.
            answer = submit(held, "Done.")
            assert answer.status_code == 200, answer.text
            status = client.get(f"/api/v2/generate/text/status/{first.json()['id']}").json()
            assert status["done"] is True
            job = pop()
            assert job["id"] is not None
            answer = submit(job["id"], "Ok.")
            assert answer.status_code == 200, answer.text
            status = client.get(f"/api/v2/generate/text/status/{acknowledged.json()['id']}").json()
            assert status["done"] is True

            # New requests go to the new primary; the discovery routes read its standby.
            later = queue("After the failover.")
            assert later.status_code == 202, later.text
            assert client.get("/api/v2/status/models?type=text").status_code == 200
        checked = subprocess.run(
            [sys.executable, "manage.py", "check_kudos"],
            cwd=ROOT,
            env={**env, "DATABASE_REPLICA_URL": ""},
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT_SECONDS,
        )
        assert checked.returncode == 0, checked.stderr
        stack.assert_alive()
    except BaseException:
        print(stack.output())
        print(patroni_cluster.logs())
        raise
    finally:
        for server in stack.servers:
            server.stop()
            server.log.close()
    # What the test saw, for the record (docs/reference/operations.md states it).
    print(
        f"{new} promoted; calls refused for {max(refused, default=killed) - killed:.1f} s, "
        f"served again {served_again:.1f} s after the kill"
    )
