"""The shipped HAProxy example (docs/examples/haproxy.cfg, Debian's HAProxy) in front of two web
processes: the routes pass through it, a chat reply that waits longer than the API's server
timeout is not cut, a host killed under load costs its clients nothing, and the calls a dying
host held are sent to the other or answered."""

import json
import os
import signal
import time

import anthropic
import httpx
import openai
import pytest

from jobs.models import TextRequest
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


def _raised(call, **kwargs) -> Exception:
    """What `call` raised (the test fails if it returned)."""
    try:
        call(**kwargs)
    except Exception as raised:  # noqa: BLE001 - handed to the test's assertions
        return raised
    raise AssertionError(f"{call} returned")


@pytest.mark.live_env(TRUSTED_PROXIES="127.0.0.1")
def test_calls_a_dying_host_held_go_to_the_other_or_are_answered_502(live_stack, make_caller):
    # Every call to the first host while it is up, so that all the calls below reach it.
    proxy = HAProxy(live_stack.urls, replace={"balance leastconn": "balance first"})
    requester, owner = make_caller("dying-host-requester"), make_caller("dying-host-owner")
    horde = {"apikey": requester.api_key}
    clients: list[httpx.Client] = []
    try:
        worker = ChatWorker(proxy.url, owner.api_key, name="dying-host-w", model="chat-model")
        clients.append(worker.http)
        assert worker.pop()["id"] is None  # checks in; its connection is kept for the next pop

        def client() -> httpx.Client:
            # Each call on a connection that has served one already: HAProxy answers the first
            # call of a connection whose host died 502 whatever its configuration.
            made = httpx.Client(base_url=proxy.url, timeout=30)
            clients.append(made)
            assert made.get("/api/v2/status/heartbeat").status_code == 200
            return made

        polling, queueing = client(), client()
        # The SDKs with their default retries, each having listed the models first (as a
        # client does), on the connection it keeps if HAProxy lets it.
        chat = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=requester.api_key)
        messages = anthropic.Anthropic(base_url=proxy.url, api_key=requester.api_key)
        assert chat.models.list().data and messages.models.list().data
        hi = [{"role": "user", "content": "Hi"}]

        hung = live_stack.servers[0].process
        os.kill(hung.pid, signal.SIGSTOP)  # the host hangs: the calls wait in its backlog
        calls = {
            "pop": Background(worker.pop),
            "poll": Background(polling.get, "/api/v2/status/models", params={"type": "text"}),
            "queue": Background(
                queueing.post, "/api/v2/generate/text/async", headers=horde, json={"prompt": "Once"}
            ),
            "chat": Background(
                _raised, chat.chat.completions.create, model="chat-model", messages=hi, stream=True
            ),
            "messages": Background(
                _raised, messages.messages.create, model="chat-model", max_tokens=16, messages=hi, stream=True
            ),
        }
        time.sleep(0.5)
        hung.kill()  # then dies: the kernel resets the connections it never read
        answers = {name: call.result() for name, call in calls.items()}

        # The workers' call (ChatWorker.pop asserts its 200) and the read went to the other
        # host, which answered them.
        assert answers["pop"]["id"] is None
        assert answers["poll"].status_code == 200
        # The requesters' calls that may have queued a request are answered, in each API's
        # shape, and the SDKs are told not to send them again: they raise at once, and nothing
        # was queued (a request sent again would be, by the other host).
        queued = answers["queue"]
        assert (queued.status_code, queued.json()["rc"]) == (502, "HostLost"), queued.text
        assert queued.headers["x-should-retry"] == "false"
        for name, sdk_error in (
            ("chat", openai.InternalServerError),
            ("messages", anthropic.InternalServerError),
        ):
            raised = answers[name]
            assert isinstance(raised, sdk_error) and raised.status_code == 502, repr(raised)
            assert "stopped before it answered" in raised.message, raised.message
        assert not TextRequest.objects.filter(account=requester.account).exists()
    finally:
        for made in clients:
            made.close()
        proxy.stop()


@pytest.mark.live_env(TRUSTED_PROXIES="127.0.0.1")
def test_a_stream_cut_by_its_host_dying_is_cancelled_at_the_workers_next_post(live_stack, make_caller):
    proxy = HAProxy(live_stack.urls, replace={"balance leastconn": "balance first"})
    requester, owner = make_caller("cut-stream-requester"), make_caller("cut-stream-owner")
    worker = ChatWorker(proxy.url, owner.api_key, name="cut-stream-w", model="chat-model")
    try:
        assert worker.pop()["id"] is None
        body = {"model": "chat-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {requester.api_key}"}
        # The reply's head waits for its first output.
        serving = Background(lambda: (worker.pop_job(), worker.progress("Half")))
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as streamed:
                assert serving.result()[1].status_code == 200
                lines = streamed.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                live_stack.servers[0].process.kill()  # the stream's host, mid-reply
                with pytest.raises(httpx.RemoteProtocolError):
                    list(lines)
        # Nobody can be sent the rest: the worker's next post, through the other host, is told
        # to stop, and the requester pays nothing.
        told = worker.progress(" and whole.")
        assert told.status_code == 409 and told.json()["rc"] == "GenerationCancelled", told.text
        request_id = json.loads(first[6:])["id"].removeprefix("chatcmpl-")
        text_request = TextRequest.objects.get(pk=request_id)
        assert (text_request.state, text_request.ending) == ("cancelled", "ServiceUnavailable")
        assert text_request.kudos_spent == 0
    finally:
        worker.close()
        proxy.stop()
