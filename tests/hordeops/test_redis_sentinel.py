"""Redis Sentinel (REDIS_SENTINELS): the web app's Redis clients ask three real sentinels for the
primary; the primary is killed (SIGKILL), the sentinels promote its replica, and the web app
goes on with it: the job in a worker's hands is accepted, new requests are served."""

import json
import time

import httpx
import pytest

from tests.live import Background, ChatWorker

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)


def _until(check, *, seconds: float) -> float:
    """Poll `check` until it is true; the seconds it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "not within the time allowed"
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_sentinel_failover_is_followed_and_no_job_is_lost(sentinel_redis, live_stack, make_caller):
    requester, owner = make_caller("sentinel-requester"), make_caller("sentinel-owner")
    with httpx.Client(base_url=live_stack.urls[0], timeout=10) as client:

        def queue(prompt: str) -> httpx.Response:
            return client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": requester.api_key},
                json={"prompt": prompt, "models": ["m1"]},
            )

        def pop() -> httpx.Response:
            return client.post(
                "/api/v2/generate/text/pop",
                headers={"apikey": owner.api_key},
                json={"name": "w", "models": ["m1"]},
            )

        def submit(job_id: str) -> httpx.Response:
            return client.post(
                "/api/v2/generate/text/submit",
                headers={"apikey": owner.api_key},
                json={"id": job_id, "generation": "Done."},
            )

        first = queue("Before the failover.").json()["id"]
        held = pop().json()["id"]
        assert held is not None

        old_primary = sentinel_redis.primary.port
        sentinel_redis.primary.kill()
        promoted = _until(lambda: sentinel_redis.primary_port() != old_primary, seconds=20)

        # The job a worker held through the failover is accepted once the new primary answers.
        def submitted() -> bool:
            answer = submit(held)
            assert answer.status_code in (200, 503), answer.text  # 503: Redis not there yet
            return answer.status_code == 200

        recovered = _until(submitted, seconds=20)
        assert client.get(f"/api/v2/generate/text/status/{first}").json()["done"] is True

        # New requests are queued, handed out and accepted through the new primary.
        second = queue("After the failover.")
        assert second.status_code == 202, second.text
        job = pop().json()
        assert job["id"] is not None and submit(job["id"]).status_code == 200
        assert client.get(f"/api/v2/generate/text/status/{second.json()['id']}").json()["done"] is True
        assert client.get("/metrics").status_code == 200

        # A chat reply streamed through the relay, whose pub/sub client asks the sentinels too.
        worker = ChatWorker(live_stack.urls[0], owner.api_key, name="chat-w", model="chat-model")
        assert worker.pop()["id"] is None  # checks in with its model

        def serve() -> None:
            worker.pop_job()
            worker.stream(["Hello", " again."])
            assert worker.submit("Hello again.").status_code == 200

        serving = Background(serve)
        body = {"model": "chat-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {requester.api_key}"},
        ) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        serving.result()
        deltas = [
            json.loads(line[6:])["choices"][0]["delta"].get("content")
            for line in lines
            if line != "data: [DONE]" and json.loads(line[6:])["choices"]
        ]
        assert "".join(d for d in deltas if d) == "Hello again." and lines[-1] == "data: [DONE]"
    live_stack.assert_alive()
    # What the test saw, for the record (docs/reference/operations.md states it).
    print(f"promoted after {promoted:.1f} s, the held job accepted {recovered:.1f} s later")
