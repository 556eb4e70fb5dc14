"""The chat relay end to end: real uvicorn processes, the official `openai` SDK, raw SSE.

The requester talks to one server process and the worker to another, so every reply crosses
processes through PostgreSQL and the Redis relay stream. Leases are lapsed by moving the
generation's `popped_at` into the past, never by sleeping.
"""

import json
import socket
import time
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from django.db.models import F

from jobs import services
from jobs.models import Generation, TextRequest
from tests.live import Background, ChatWorker

MODEL = "koboldcpp/relay-test-8B"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello in a few languages."},
]
# Unicode, whitespace-only and newline deltas: each must reach the requester byte for byte.
DELTAS = ["Héllo", ",", " ", "wörld", " 🦄", "\n\n", "\t- 中文  ", "Ωmega…", "  \r\n", "end."]
WAIT_SECONDS = 20


@pytest.fixture
def accounts(make_caller):
    return make_caller("relay-requester"), make_caller("relay-owner")


def _sdk(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=WAIT_SECONDS)


def _lapse_and_run_stale_pass(generation_id: str) -> services.StalePassResult:
    """Move the pop back past any lease this generation could hold, then run one stale pass."""
    generation = Generation.objects.get(pk=generation_id)
    Generation.objects.filter(pk=generation_id).update(
        popped_at=F("popped_at") - timedelta(seconds=generation.cap_seconds + 60)
    )
    result = services.abort_stale_generations()
    assert result.ran and result.aborted == 1, result
    return result


def _wait_for(predicate, what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _data(line: str) -> Any:
    assert line.startswith("data: "), line
    payload = line[len("data: ") :]
    return payload if payload == "[DONE]" else json.loads(payload)


def _stream_body(stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "stream": stream}


def test_the_openai_sdk_streams_a_reply_relayed_across_two_server_processes(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL)
    assert worker.pop()["id"] is None  # checks the worker in with its model

    def serve() -> str:
        worker.pop_job()
        worker.stream(DELTAS, retry=frozenset({1, 4, 6}))
        # A late retry of an early seq, with a different delta: accepted, never relayed.
        late = worker.progress("DUPLICATE", seq=2)
        assert late.status_code == 200 and late.json()["lease"] == "not_renewed", late.text
        submitted = worker.submit("".join(DELTAS))
        assert submitted.status_code == 200, submitted.text
        return worker.id

    serving = Background(serve)
    stream = _sdk(server_a, requester.api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True
    )
    chunks = list(stream)
    generation_id = serving.result()

    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert contents == DELTAS  # in order, once each, retries not relayed again
    assert "".join(contents) == "".join(DELTAS)
    assert chunks[0].choices[0].delta.role == "assistant"
    final = chunks[-1]
    assert final.choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert final.usage is not None and final.usage.completion_tokens == 2 * len(DELTAS)
    assert final.usage.kudos == Generation.objects.get(pk=generation_id).reward > 0
    assert len({c.id for c in chunks}) == 1

    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.DONE and generation.text == "".join(DELTAS)
    text_request = generation.request
    assert text_request.state == TextRequest.State.DONE
    assert text_request.stream_generation == generation.pk
    assert chunks[0].id == f"chatcmpl-{text_request.pk}"
    live_stack.assert_alive()


def test_the_openai_sdk_gets_a_non_streamed_reply_with_its_usage(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL)
    worker.pop()
    reply = " Bonjour,\n\tle monde — 世界 🌍 "

    def serve() -> str:
        worker.pop_job()
        worker.stream([reply[:9], reply[9:]])  # progress is allowed, and ignored, when not streaming
        assert worker.submit(reply).status_code == 200
        return worker.id

    serving = Background(serve)
    completion = _sdk(server_a, requester.api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=300
    )
    generation_id = serving.result()

    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    [choice] = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == reply
    assert choice.finish_reason == "stop"
    assert completion.usage.completion_tokens == 4  # the worker's own running count
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 4
    # And what it cost, beside the tokens: the generation's settlement (an extra key the SDK keeps).
    assert completion.usage.kudos == Generation.objects.get(pk=generation_id).reward > 0
    text_request = Generation.objects.get(pk=generation_id).request
    assert text_request.max_length == 300
    assert text_request.stream_generation is None  # a plain reply commits no stream
    assert completion.id == f"chatcmpl-{text_request.pk}"


def _committed_stream(
    server: str, requester, worker: ChatWorker, sent: list[str], end
) -> tuple[list, list, str]:
    """A raw SSE chat request that `worker` serves `sent` to, which commits its stream; then
    `end(generation_id)`. The stream's events before it and after, and the generation."""

    def serve_some() -> str:
        worker.pop_job()
        worker.stream(sent)
        return worker.id

    serving = Background(serve_some)
    headers = {"Authorization": f"Bearer {requester.api_key}"}
    with httpx.Client(base_url=server, headers=headers, timeout=WAIT_SECONDS) as http:
        with http.stream("POST", "/v1/chat/completions", json=_stream_body()) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            data_lines = (line for line in response.iter_lines() if line)
            head = [_data(next(data_lines)) for _ in range(1 + len(sent))]
            generation_id = serving.result()
            end(generation_id)
            tail = [_data(line) for line in data_lines]
    return head, tail, generation_id


def test_a_give_back_after_the_stream_is_committed_is_told_as_a_give_back_not_a_lapse(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="giving-worker", model=MODEL)
    worker.pop()

    def give_back(generation_id: str) -> None:
        assert worker.submit("", state="faulted").status_code == 200  # the worker's Ctrl-C

    _, [error_event], _ = _committed_stream(server_a, requester, worker, DELTAS[:2], give_back)
    assert error_event["error"]["code"] == "generation_given_back"
    assert "lapsed" not in error_event["error"]["message"]


def test_an_abort_after_the_stream_is_committed_ends_it_with_an_error_event_and_no_done(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL)
    worker.pop()
    sent = DELTAS[:3]

    def serve_some() -> str:
        worker.pop_job()
        worker.stream(sent)
        return worker.id

    # Raw SSE over httpx: read the relayed deltas, then lapse the lease and run the stale pass.
    head, tail, generation_id = _committed_stream(
        server_a, requester, worker, sent, _lapse_and_run_stale_pass
    )

    assert head[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [event["choices"][0]["delta"]["content"] for event in head[1:]] == sent
    assert len(tail) == 1, tail  # one error event, then the stream ends: no [DONE]
    [error_event] = tail
    assert error_event != "[DONE]"
    assert set(error_event) == {"error"}
    error = error_event["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "generation_aborted"
    assert error["param"] is None
    assert isinstance(error["message"], str) and error["message"]

    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.ABORTED
    text_request = generation.request
    assert text_request.state == TextRequest.State.FAULTED
    assert text_request.queued == 0  # faulted, not restarted: no fallback after commit
    assert worker.pop()["id"] is None
    late = worker.progress("too late")
    assert late.status_code == 400 and late.json()["rc"] == "AbortedGen", late.text
    late_submit = worker.submit("".join(sent))
    assert late_submit.status_code == 400 and late_submit.json()["rc"] == "AbortedGen", late_submit.text

    # The official SDK raises on that same event.
    serving = Background(serve_some)
    stream = _sdk(server_a, requester.api_key).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                if len(received) == len(sent):
                    _lapse_and_run_stale_pass(serving.result())
    assert not isinstance(raised.value, openai.APIStatusError)
    assert raised.value.body["code"] == "generation_aborted"
    assert received == sent
    assert Generation.objects.get(pk=worker.id).request.state == TextRequest.State.FAULTED


def test_an_abort_before_commitment_restarts_the_job_and_the_requester_keeps_waiting(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    first = ChatWorker(server_b, owner.api_key, name="relay-worker-1", model=MODEL)
    second = ChatWorker(server_a, owner.api_key, name="relay-worker-2", model=MODEL)
    first.pop()
    reply = ["Second", " worker", " — ", "ünïcode", "\n", "intact."]

    def request() -> list[str]:
        stream = _sdk(server_a, requester.api_key).chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True
        )
        return [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]

    requesting = Background(request)
    first.pop_job()  # and posts nothing
    _lapse_and_run_stale_pass(first.id)
    aborted = Generation.objects.get(pk=first.id)
    assert aborted.state == Generation.State.ABORTED
    text_request = aborted.request
    assert (text_request.state, text_request.queued, text_request.restarts) == (
        TextRequest.State.ACTIVE,
        1,
        1,
    )
    assert text_request.stream_generation is None
    time.sleep(0.3)  # a requester that gave up on the restart would be done by now
    assert not requesting.done()

    second.pop_job()
    assert second.id != first.id
    assert Generation.objects.get(pk=second.id).request_id == text_request.pk
    second.stream(reply)
    assert second.submit("".join(reply)).status_code == 200

    assert requesting.result() == reply
    text_request.refresh_from_db()
    assert text_request.state == TextRequest.State.DONE
    assert str(text_request.stream_generation) == second.id
    late = first.progress("I am back")
    assert late.status_code == 400 and late.json()["rc"] == "AbortedGen", late.text


def test_a_requester_that_disconnects_cancels_its_request(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL)
    worker.pop()

    def serve_one() -> str:
        worker.pop_job()
        # Its output reaches the requester before this answer reaches the worker: the requester
        # may have left, and the request been cancelled, by then.
        first = worker.progress(DELTAS[0], tokens=2)
        assert first.status_code == 200 or first.json()["rc"] == "GenerationCancelled", first.text
        return worker.id

    serving = Background(serve_one)
    headers = {"Authorization": f"Bearer {requester.api_key}"}
    http = httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS)
    with http.stream("POST", "/v1/chat/completions", json=_stream_body()) as response:
        assert response.status_code == 200
        data_lines = (line for line in response.iter_lines() if line)
        assert _data(next(data_lines))["choices"][0]["delta"]["role"] == "assistant"
        assert _data(next(data_lines))["choices"][0]["delta"]["content"] == DELTAS[0]
    http.close()  # the connection goes away mid-stream
    generation_id = serving.result()
    text_request = Generation.objects.get(pk=generation_id).request

    def cancelled() -> bool:
        text_request.refresh_from_db()
        return text_request.state == TextRequest.State.CANCELLED

    _wait_for(cancelled, "the abandoned request to be cancelled", timeout=10)
    assert text_request.queued == 0
    assert Generation.objects.get(pk=generation_id).state == Generation.State.CANCELLED
    late = worker.progress(DELTAS[1])
    assert late.status_code == 409 and late.json()["rc"] == "GenerationCancelled", late.text
    late_submit = worker.submit("".join(DELTAS))
    assert late_submit.status_code == 409 and late_submit.json()["rc"] == "GenerationCancelled"
    live_stack.assert_alive()


def test_a_requester_that_disconnects_while_still_queued_cancels_its_request(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    worker = ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL)
    worker.pop()
    body = json.dumps(_stream_body()).encode()
    host, port = httpx.URL(server_a).host, httpx.URL(server_a).port
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {requester.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    # No response has started (no worker output yet) when the connection goes away.
    with socket.create_connection((host, port), timeout=WAIT_SECONDS) as sock:
        sock.sendall(head + body)
        _wait_for(TextRequest.objects.exists, "the chat request to be queued")
    text_request = TextRequest.objects.get()

    def cancelled() -> bool:
        text_request.refresh_from_db()
        return text_request.state == TextRequest.State.CANCELLED

    _wait_for(cancelled, "the abandoned request to be cancelled", timeout=10)
    assert text_request.queued == 0
    assert worker.pop()["id"] is None  # nobody serves a requester that is gone
    live_stack.assert_alive()


def test_bad_models_keys_and_bodies_get_openai_errors(live_stack, accounts):
    server_a, server_b = live_stack.urls
    requester, owner = accounts
    ChatWorker(server_b, owner.api_key, name="relay-worker", model=MODEL).pop()
    sdk = _sdk(server_a, requester.api_key)

    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as raised:
            sdk.chat.completions.create(model="no/such-model", messages=MESSAGES, stream=stream)
        assert raised.value.status_code == 404
        assert raised.value.code == "model_not_found"

    with pytest.raises(openai.AuthenticationError) as raised:
        _sdk(server_a, "x" * 22).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"

    headers = {"Authorization": f"Bearer {requester.api_key}", "content-type": "application/json"}
    with httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS) as http:
        for body in (
            json.dumps({"model": MODEL, "messages": "hello"}),
            json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": -1}),
            '{"model": "' + MODEL + '", "messages": [',
        ):
            response = http.post("/v1/chat/completions", content=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert set(response.json()) == {"error"}
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error"
            assert isinstance(error["message"], str) and error["message"]
            assert isinstance(error["code"], str) and error["code"]
    assert not TextRequest.objects.exists()
