"""The shipped HAProxy example (docs/examples/haproxy.cfg, Debian's HAProxy) in front of two web
processes: the routes pass through it, a chat reply that waits longer than the API's server
timeout is not cut, and a host killed under load costs its clients nothing."""

import json
import time

import httpx
import pytest

from tests.live import Background, ChatWorker, HAProxy

pytestmark = pytest.mark.parametrize("live_stack", [2], indirect=True)


@pytest.mark.live_env(TRUSTED_PROXIES="127.0.0.1")
def test_behind_haproxy_a_waiting_stream_lasts_and_a_dead_host_costs_nothing(live_stack, make_caller):
    # The API's server timeout made short, so that the stream outlasts it within the test.
    proxy = HAProxy(live_stack.urls, replace={"    timeout server 60s": "    timeout server 2s"})
    requester, owner = make_caller("proxied-requester"), make_caller("proxied-owner")
    try:
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            worker = ChatWorker(proxy.url, owner.api_key, name="proxied-w", model="chat-model")
            assert worker.pop()["id"] is None  # checks in with its model

            def serve_late() -> None:
                time.sleep(4)  # the reply waits twice the API's server timeout for its worker
                worker.pop_job()
                worker.stream(["Worth", " the wait."])
                assert worker.submit("Worth the wait.").status_code == 200

            serving = Background(serve_late)
            body = {"model": "chat-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
            headers = {"Authorization": f"Bearer {requester.api_key}"}
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as streamed:
                assert streamed.status_code == 200
                lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
            serving.result()
            chunks = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            assert text == "Worth the wait." and lines[-1] == "data: [DONE]"

        # One host dies; requests go to the other, none answered with an error: refused
        # connections are sent again elsewhere, and the health check takes the host out.
        live_stack.servers[0].process.kill()
        answers = []
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            for n in range(20):  # within the account's bound of waiting requests
                queued = client.post(
                    "/api/v2/generate/text/async",
                    headers={"apikey": requester.api_key},
                    json={"prompt": f"{n}"},
                )
                answers.append(queued.status_code)
                if queued.status_code == 202:
                    answers.append(
                        client.get(f"/api/v2/generate/text/status/{queued.json()['id']}").status_code
                    )
                answers.append(client.get("/api/v2/status/models?type=text").status_code)
                time.sleep(0.15)
        assert set(answers) == {200, 202}, answers
    finally:
        proxy.stop()
