"""OpenAI Responses and Anthropic Messages over the chat relay: official SDKs, raw SSE, errors.

The requester talks to one uvicorn process and the worker to another, as in
test_chat_relay.py, so every reply crosses processes through PostgreSQL and the Redis relay
stream. Leases are lapsed by moving the generation's `popped_at` into the past, never by
sleeping. The last tests call the protocol encoders directly, with no server.
"""

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.db.models import F

from hordeops import errors
from jobs import services
from jobs.models import Ending, Generation, TextRequest
from jobs.protocols import AnthropicMessages, OpenAIChat, OpenAIResponses, Reply, Usage
from jobs.replies import failure
from tests.live import Background, ChatWorker

MODEL = "koboldcpp/protocols-test-8B"
# The first delta has text (white space alone is held back until output arrives); then
# Unicode, white-space-only and newline deltas, each to reach the requester byte for byte.
DELTAS = ["Héllo", ",", " ", "wörld", " 🦄", "\n\n", "\t- 中文  ", "Ωmega…", "  \r\n", "end."]
TEXT = "".join(DELTAS)
WAIT_SECONDS = 20
RESPONSES_STREAM = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * len(DELTAS),
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
MESSAGES_STREAM = [
    "message_start",
    "content_block_start",
    *["content_block_delta"] * len(DELTAS),
    "content_block_stop",
    "message_delta",
    "message_stop",
]


@pytest.fixture
def accounts(make_caller):
    return make_caller("protocols-requester"), make_caller("protocols-owner")


@pytest.fixture
def worker(live_stack, accounts) -> Iterator[ChatWorker]:
    """A chat worker of MODEL on the second server, checked in (so that the model is known)."""
    chat_worker = ChatWorker(live_stack.urls[1], accounts[1].api_key, name="protocols-worker", model=MODEL)
    assert chat_worker.pop()["id"] is None
    yield chat_worker
    chat_worker.close()


def _openai(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=WAIT_SECONDS)


def _anthropic(base_url: str, api_key: str, *, header: str = "bearer") -> anthropic.Anthropic:
    """The anthropic SDK with the key as `Authorization: Bearer` (its `api_key`) or `x-api-key`."""
    if header == "x-api-key":
        return anthropic.Anthropic(
            base_url=base_url, default_headers={"x-api-key": api_key}, max_retries=0, timeout=WAIT_SECONDS
        )
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=WAIT_SECONDS)


def _lapse_and_run_stale_pass(generation_id: str) -> None:
    """Move the pop back past any lease this generation could hold, then run one stale pass."""
    generation = Generation.objects.get(pk=generation_id)
    Generation.objects.filter(pk=generation_id).update(
        popped_at=F("popped_at") - timedelta(seconds=generation.cap_seconds + 60)
    )
    result = services.abort_stale_generations()
    assert result.ran and result.aborted == 1, result


def _serve(chat_worker: ChatWorker, deltas: list[str], reply: str | None = None) -> str:
    """Pop a job, stream `deltas` (tokens run 2 a post), submit `reply`; return the job id."""
    chat_worker.pop_job()
    chat_worker.stream(deltas)
    submitted = chat_worker.submit(TEXT if reply is None else reply)
    assert submitted.status_code == 200, submitted.text
    return chat_worker.id


def _serve_some(chat_worker: ChatWorker, deltas: list[str]) -> str:
    """Pop a job and stream `deltas`, then go silent; return the job id."""
    chat_worker.pop_job()
    chat_worker.stream(deltas)
    return chat_worker.id


def _sse(lines: Iterator[str]) -> Iterator[tuple[str | None, Any]]:
    """(event name, parsed data) for each SSE event of a line iterator."""
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data.append(line[len("data: ") :])
        elif line == "" and data:
            yield name, json.loads("\n".join(data))
            name, data = None, []
    if data:
        yield name, json.loads("\n".join(data))


def _request_of(generation_id: str) -> TextRequest:
    return Generation.objects.get(pk=generation_id).request


# --- OpenAI Responses ------------------------------------------------------------------------


def test_the_openai_sdk_streams_a_responses_reply_with_every_event_in_order(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    serving = Background(_serve, worker, DELTAS)
    stream = _openai(server_a, accounts[0].api_key).responses.create(
        model=MODEL,
        instructions="You are terse.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
        stream=True,
    )
    events = list(stream)
    generation_id = serving.result()

    assert [event.type for event in events] == RESPONSES_STREAM
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert deltas == DELTAS  # in order, once each, byte for byte
    created, completed = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == []
    assert completed.status == "completed" and completed.incomplete_details is None
    assert completed.output_text == TEXT
    [item] = completed.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert events[-4].text == TEXT  # response.output_text.done
    assert events[-2].item.id == item.id and item.id.startswith("msg_")
    assert completed.usage.output_tokens == 2 * len(DELTAS)
    assert completed.usage.input_tokens > 0
    assert completed.usage.total_tokens == completed.usage.input_tokens + completed.usage.output_tokens

    text_request = _request_of(generation_id)
    assert completed.id == created.id == f"resp_{text_request.pk.hex}"
    assert text_request.state == TextRequest.State.DONE
    # No max_output_tokens: the most the model's online worker accepts.
    assert text_request.max_length == worker.max_length
    # The instructions reach the worker as the first, system message.
    assert worker.job["payload"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    live_stack.assert_alive()


def test_the_openai_sdk_parses_a_non_streamed_response_and_its_output_text(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    reply = " Bonjour,\n\tle monde — 世界 🌍 "
    serving = Background(_serve, worker, [reply[:9], reply[9:]], reply)
    response = _openai(server_a, accounts[0].api_key).responses.create(
        model=MODEL, input="Say hello.", max_output_tokens=300, temperature=0.5, top_p=0.9
    )
    generation_id = serving.result()

    assert response.object == "response"
    assert response.output_text == reply
    assert response.status == "completed" and response.incomplete_details is None
    assert response.model == MODEL
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [part.type for part in item.content] == ["output_text"]
    assert response.usage.output_tokens == 4  # the worker's own running count
    assert response.usage.total_tokens == response.usage.input_tokens + 4
    text_request = _request_of(generation_id)
    assert response.id == f"resp_{text_request.pk.hex}"
    assert text_request.max_length == 300
    assert text_request.params == {"temperature": 0.5, "top_p": 0.9}
    assert worker.job["payload"]["messages"] == [{"role": "user", "content": "Say hello."}]


def test_a_responses_reply_cut_at_max_output_tokens_is_incomplete_in_both_forms(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    sdk = _openai(server_a, accounts[0].api_key)
    cut = ["Once", " upon"]  # 2 tokens a post: 4 tokens reach max_output_tokens

    serving = Background(_serve, worker, cut, "".join(cut))
    response = sdk.responses.create(model=MODEL, input="Tell a story.", max_output_tokens=4)
    serving.result()
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Once upon"

    serving = Background(_serve, worker, cut, "".join(cut))
    events = list(sdk.responses.create(model=MODEL, input="Tell a story.", max_output_tokens=4, stream=True))
    serving.result()
    final = events[-1]
    assert final.type == "response.completed"  # the SDK's helpers finish on this event only
    assert final.response.status == "incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output_text == "Once upon"


def test_an_abort_after_a_responses_stream_is_committed_ends_it_with_one_error_event(
    live_stack, accounts, worker
):
    server_a, _ = live_stack.urls
    sent = DELTAS[:3]

    serving = Background(_serve_some, worker, sent)
    headers = {"Authorization": f"Bearer {accounts[0].api_key}"}
    body = {"model": MODEL, "input": "Say hello.", "stream": True}
    with httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS) as http:
        with http.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _sse(response.iter_lines())
            head = [next(events) for _ in range(4 + len(sent))]
            generation_id = serving.result()
            _lapse_and_run_stale_pass(generation_id)
            tail = list(events)

    assert [name for name, _ in head] == RESPONSES_STREAM[:4] + ["response.output_text.delta"] * len(sent)
    assert all(name == data["type"] for name, data in head)
    assert [data["delta"] for _, data in head[4:]] == sent
    assert len(tail) == 1, tail  # one error event, then the stream ends: no response.completed
    [(name, error_event)] = tail
    assert name == "error"
    assert set(error_event) == {"type", "code", "message", "param", "sequence_number", "error"}
    assert error_event["type"] == "error"
    assert error_event["code"] == "generation_aborted"
    assert error_event["param"] is None
    assert error_event["sequence_number"] == len(head)
    assert error_event["error"] == {
        "type": "server_error",
        "code": "generation_aborted",
        "message": error_event["message"],
        "param": None,
    }
    text_request = _request_of(generation_id)
    assert text_request.state == TextRequest.State.FAULTED
    assert text_request.queued == 0  # no fallback after commit

    # The openai SDK raises on that same event.
    serving = Background(_serve_some, worker, sent)
    stream = _openai(server_a, accounts[0].api_key).responses.create(
        model=MODEL, input="Say hello.", stream=True
    )
    received, types = [], []
    with pytest.raises(openai.APIError) as raised:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                received.append(event.delta)
                if len(received) == len(sent):
                    _lapse_and_run_stale_pass(serving.result())
    assert not isinstance(raised.value, openai.APIStatusError)
    assert raised.value.code == "generation_aborted"
    assert raised.value.type == "server_error"
    assert received == sent
    assert "response.completed" not in types
    live_stack.assert_alive()


def test_bad_keys_unknown_models_and_bad_bodies_get_openai_errors_on_responses(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    sdk = _openai(server_a, accounts[0].api_key)
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as raised:
            sdk.responses.create(model="no/such-model", input="Hi.", stream=stream)
        assert raised.value.status_code == 404
        assert raised.value.code == "model_not_found"

    with pytest.raises(openai.AuthenticationError) as raised:
        _openai(server_a, "x" * 22).responses.create(model=MODEL, input="Hi.")
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"

    headers = {"Authorization": f"Bearer {accounts[0].api_key}", "content-type": "application/json"}
    with httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS) as http:
        for body, param in (
            (json.dumps({"model": MODEL}), "input"),
            (json.dumps({"model": MODEL, "input": 5}), "input"),
            (json.dumps({"model": MODEL, "input": []}), "input"),
            (json.dumps({"model": MODEL, "input": "Hi.", "max_output_tokens": 0}), "max_output_tokens"),
            (json.dumps({"model": MODEL, "input": "Hi.", "max_output_tokens": 16385}), "max_output_tokens"),
            (json.dumps({"model": MODEL, "input": "Hi.", "stream": "yes"}), "stream"),
            (
                json.dumps(
                    {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}
                ),
                "input.0.content",
            ),
            (json.dumps({"model": MODEL, "input": [{"role": "robot", "content": "Hi."}]}), "input.0.role"),
            ('{"model": "' + MODEL + '", "input": [', None),
        ):
            response = http.post("/v1/responses", content=body)
            assert response.status_code == 400, response.text
            assert set(response.json()) == {"error"}
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error"
            assert error["param"] == param
            assert isinstance(error["message"], str) and error["message"]
            assert isinstance(error["code"], str) and error["code"]
        assert http.get("/v1/responses").json()["error"]["code"] == "method_not_allowed"
    assert not TextRequest.objects.exists()


# --- Anthropic Messages ----------------------------------------------------------------------


def test_the_anthropic_sdk_streams_a_messages_reply_with_every_event_in_order(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    serving = Background(_serve, worker, DELTAS)
    stream = _anthropic(server_a, accounts[0].api_key, header="x-api-key").messages.create(
        model=MODEL,
        max_tokens=500,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        stop_sequences=["\nUser:"],
        stream=True,
    )
    events = list(stream)  # the SDK drops `ping`
    generation_id = serving.result()

    assert [event.type for event in events] == MESSAGES_STREAM
    start = events[0].message
    assert start.role == "assistant" and start.content == [] and start.stop_reason is None
    assert events[1].index == 0 and events[1].content_block.type == "text"
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert all(delta.type == "text_delta" for delta in deltas)
    assert [delta.text for delta in deltas] == DELTAS
    message_delta = events[-2]
    assert message_delta.delta.stop_reason == "end_turn"
    assert message_delta.delta.stop_sequence is None
    assert message_delta.usage.output_tokens == 2 * len(DELTAS)
    assert message_delta.usage.input_tokens > 0

    text_request = _request_of(generation_id)
    assert start.id == f"msg_{text_request.pk.hex}"
    assert text_request.max_length == 500
    assert worker.job["payload"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    assert worker.job["payload"]["stop_sequence"] == ["\nUser:"]

    # The SDK's stream helper assembles the same message.
    serving = Background(_serve, worker, DELTAS)
    with _anthropic(server_a, accounts[0].api_key).messages.stream(
        model=MODEL, max_tokens=500, messages=[{"role": "user", "content": "Say hello."}]
    ) as helper:
        assert "".join(helper.text_stream) == TEXT
        final = helper.get_final_message()
    serving.result()
    assert [block.text for block in final.content] == [TEXT]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 2 * len(DELTAS) and final.usage.input_tokens > 0
    live_stack.assert_alive()


def test_the_anthropic_sdk_parses_a_non_streamed_message_and_its_stop_reasons(live_stack, accounts, worker):
    server_a, _ = live_stack.urls
    sdk = _anthropic(server_a, accounts[0].api_key)
    reply = " Bonjour,\n\tle monde — 世界 🌍 "

    serving = Background(_serve, worker, [reply[:9], reply[9:]], reply)
    message = sdk.messages.create(
        model=MODEL,
        max_tokens=300,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello."}],
        # anthropic 2.14 has no sampling arguments; the route still takes them.
        extra_body={"temperature": 0.5, "top_p": 0.9},
    )
    generation_id = serving.result()
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert len(message.content) == 1 and message.content[0].type == "text"
    assert message.content[0].text == reply
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == 4 and message.usage.input_tokens > 0
    text_request = _request_of(generation_id)
    assert message.id == f"msg_{text_request.pk.hex}"
    assert text_request.max_length == 300
    assert text_request.params == {"temperature": 0.5, "top_p": 0.9}

    cut = ["Once", " upon"]  # 2 tokens a post: 4 tokens reach max_tokens
    serving = Background(_serve, worker, cut, "".join(cut))
    message = sdk.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Tell a story."}]
    )
    serving.result()
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "Once upon"


def test_an_abort_after_a_messages_stream_is_committed_ends_it_with_an_error_event_and_no_stop(
    live_stack, accounts, worker
):
    server_a, _ = live_stack.urls
    sent = DELTAS[:3]

    serving = Background(_serve_some, worker, sent)
    headers = {"x-api-key": accounts[0].api_key, "anthropic-version": "2023-06-01"}
    body = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": True,
    }
    with httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS) as http:
        with http.stream("POST", "/v1/messages", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _sse(response.iter_lines())
            head = [next(events) for _ in range(3 + len(sent))]
            generation_id = serving.result()
            _lapse_and_run_stale_pass(generation_id)
            tail = list(events)

    assert [name for name, _ in head] == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * len(sent),
    ]
    assert all(name == data["type"] for name, data in head)
    assert [data["delta"]["text"] for _, data in head[3:]] == sent
    assert len(tail) == 1, tail  # one error event, then the stream ends: no message_stop
    [(name, error_event)] = tail
    assert name == "error"
    assert set(error_event) == {"type", "error"}
    assert error_event["type"] == "error"
    assert set(error_event["error"]) == {"type", "message"}
    assert error_event["error"]["type"] == "api_error"
    assert isinstance(error_event["error"]["message"], str) and error_event["error"]["message"]
    text_request = _request_of(generation_id)
    assert text_request.state == TextRequest.State.FAULTED
    assert text_request.queued == 0

    # The anthropic SDK raises on that same event: a bare APIStatusError with the 200 status.
    serving = Background(_serve_some, worker, sent)
    stream = _anthropic(server_a, accounts[0].api_key).messages.create(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Say hello."}], stream=True
    )
    received, types = [], []
    with pytest.raises(anthropic.APIStatusError) as raised:
        for event in stream:
            types.append(event.type)
            if event.type == "content_block_delta":
                received.append(event.delta.text)
                if len(received) == len(sent):
                    _lapse_and_run_stale_pass(serving.result())
    assert type(raised.value) is anthropic.APIStatusError
    assert raised.value.status_code == 200
    assert raised.value.type == "api_error"
    assert raised.value.body["error"]["type"] == "api_error"
    assert received == sent
    assert "message_stop" not in types and "message_delta" not in types
    live_stack.assert_alive()


def test_bad_keys_unknown_models_and_bad_bodies_get_anthropic_errors_on_messages(
    live_stack, accounts, worker
):
    server_a, _ = live_stack.urls
    messages = [{"role": "user", "content": "Hi."}]
    sdk = _anthropic(server_a, accounts[0].api_key)
    for stream in (False, True):
        with pytest.raises(anthropic.NotFoundError) as raised:
            sdk.messages.create(model="no/such-model", max_tokens=10, messages=messages, stream=stream)
        assert raised.value.status_code == 404
        assert raised.value.type == "not_found_error"
        assert raised.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": raised.value.api_message},
        }

    for header in ("bearer", "x-api-key"):
        with pytest.raises(anthropic.AuthenticationError) as raised:
            _anthropic(server_a, "x" * 22, header=header).messages.create(
                model=MODEL, max_tokens=10, messages=messages
            )
        assert raised.value.status_code == 401
        assert raised.value.type == "authentication_error"

    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk.messages.create(model=MODEL, max_tokens=0, messages=messages)
    assert raised.value.status_code == 400
    assert raised.value.type == "invalid_request_error"
    assert raised.value.api_message.startswith("max_tokens: ")

    headers = {"x-api-key": accounts[0].api_key, "content-type": "application/json"}
    with httpx.Client(base_url=server_a, headers=headers, timeout=WAIT_SECONDS) as http:
        for body in (
            json.dumps({"model": MODEL, "messages": messages}),  # max_tokens is required
            json.dumps({"model": MODEL, "max_tokens": 16385, "messages": messages}),
            json.dumps({"model": MODEL, "max_tokens": 10, "messages": []}),
            json.dumps({"model": MODEL, "max_tokens": 10, "messages": [{"role": "system", "content": "x"}]}),
            json.dumps(
                {
                    "model": MODEL,
                    "max_tokens": 10,
                    "messages": [{"role": "user", "content": [{"type": "image"}]}],
                }
            ),
            json.dumps({"model": MODEL, "max_tokens": 10, "messages": messages, "system": 5}),
            json.dumps({"model": MODEL, "max_tokens": 10, "messages": messages, "stop_sequences": "END"}),
            json.dumps({"model": MODEL, "max_tokens": 10, "messages": messages, "temperature": 1.5}),
            '{"model": "' + MODEL + '", "max_tokens": 10, "messages": [',
            '{"model": "\\u0000"}',
        ):
            response = http.post("/v1/messages", content=body)
            assert response.status_code == 400, response.text
            assert set(response.json()) == {"type", "error"}, response.text
            assert response.json()["type"] == "error"
            error = response.json()["error"]
            assert set(error) == {"type", "message"}
            assert error["type"] == "invalid_request_error"
            assert isinstance(error["message"], str) and error["message"]

        method = http.get("/v1/messages")
        assert method.status_code == 405
        assert method.json()["error"]["type"] == "invalid_request_error"
        huge = http.post("/v1/messages", content=json.dumps({"model": MODEL, "system": "x" * (1 << 20)}))
        assert huge.status_code == 413
        assert huge.json() == {
            "type": "error",
            "error": {"type": "request_too_large", "message": huge.json()["error"]["message"]},
        }
        keyless = httpx.post(f"{server_a}/v1/messages", json={"model": MODEL}, timeout=WAIT_SECONDS)
        assert keyless.status_code == 401
        assert keyless.json()["error"]["type"] == "authentication_error"
    assert not TextRequest.objects.exists()


# --- Generation deadlines (X-MultiLLM-Deadline-Ms) --------------------------------------------


def test_a_deadline_that_runs_out_after_commitment_ends_each_stream_with_its_timeout_error_event(
    live_stack, accounts, worker
):
    server_a, _ = live_stack.urls
    key = accounts[0].api_key
    routes = (
        (
            "/v1/responses",
            {"Authorization": f"Bearer {key}"},
            {"model": MODEL, "input": "Hi.", "stream": True},
        ),
        (
            "/v1/messages",
            {"x-api-key": key},
            {
                "model": MODEL,
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "Hi."}],
                "stream": True,
            },
        ),
    )
    tails = []
    for path, headers, body in routes:
        serving = Background(_serve_some, worker, DELTAS[:1])  # one delta, then silence
        with httpx.Client(base_url=server_a, timeout=WAIT_SECONDS) as http:
            headers = {**headers, "X-MultiLLM-Deadline-Ms": "3000"}
            with http.stream("POST", path, json=body, headers=headers) as response:
                assert response.status_code == 200, response.read()
                events = list(_sse(response.iter_lines()))
        generation_id = serving.result()
        names = [name for name, _ in events]
        assert names.count("error") == 1 and names[-1] == "error", names
        assert not {"response.completed", "message_stop", "message_delta"} & set(names)
        tails.append(events[-1][1])
        late = worker.progress("too late")  # the generation was cancelled, not aborted
        assert late.status_code == 409 and late.json()["rc"] == "GenerationCancelled", late.text
        assert Generation.objects.get(pk=generation_id).state == Generation.State.CANCELLED

    responses_error, messages_error = tails
    assert responses_error["type"] == "error"
    assert responses_error["code"] == "generation_deadline_exceeded"
    assert responses_error["error"]["type"] == "timeout_error"
    assert responses_error["error"]["code"] == "generation_deadline_exceeded"
    assert responses_error["sequence_number"] == 5  # 4 opening events and one delta before it
    assert messages_error == {
        "type": "error",
        "error": {"type": "timeout_error", "message": messages_error["error"]["message"]},
    }


def test_a_deadline_that_runs_out_before_commitment_is_a_504_that_the_sdks_do_not_retry(
    live_stack, accounts, worker
):
    server_a, _ = live_stack.urls
    deadline = {"X-MultiLLM-Deadline-Ms": "500"}  # and no worker takes the job
    openai_sdk = openai.OpenAI(
        base_url=f"{server_a}/v1", api_key=accounts[0].api_key, timeout=WAIT_SECONDS, default_headers=deadline
    )
    with pytest.raises(openai.InternalServerError) as raised:
        openai_sdk.responses.create(model=MODEL, input="Hi.", stream=True)
    assert raised.value.status_code == 504
    assert raised.value.code == "generation_deadline_exceeded"
    assert raised.value.response.headers["x-should-retry"] == "false"

    anthropic_sdk = anthropic.Anthropic(
        base_url=server_a, api_key=accounts[0].api_key, timeout=WAIT_SECONDS, default_headers=deadline
    )
    with pytest.raises(anthropic.GatewayTimeoutError) as raised:
        anthropic_sdk.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi."}]
        )
    assert raised.value.type == "timeout_error"
    assert raised.value.response.headers["x-should-retry"] == "false"
    # Default retries are on in both SDKs: x-should-retry kept each to one request.
    assert TextRequest.objects.count() == 2

    with httpx.Client(base_url=server_a, timeout=WAIT_SECONDS) as http:
        bad = {"X-MultiLLM-Deadline-Ms": "soon", "Authorization": f"Bearer {accounts[0].api_key}"}
        response = http.post("/v1/responses", json={"model": MODEL, "input": "Hi."}, headers=bad)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_generation_deadline"
        response = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Hi."}]},
            headers=bad,
        )
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


# --- The encoders, with no server -------------------------------------------------------------

DEADLINE_MESSAGE = json.dumps(errors.GenerationDeadlineExceeded.default_message)


def test_the_deadline_error_event_after_commitment_is_exactly_the_contracts_in_each_protocol():
    err = errors.GenerationDeadlineExceeded()

    chat = OpenAIChat().stream_error(Reply(id="chatcmpl-x", model=MODEL), err)
    assert chat == [
        'data: {"error":{"message":' + DEADLINE_MESSAGE + ',"type":"timeout_error","param":null,'
        '"code":"generation_deadline_exceeded"}}\n\n'
    ]

    responses = OpenAIResponses()
    reply = Reply(id="resp_x", model=MODEL)
    started = responses.stream_start(reply) + responses.stream_delta(reply, "Hi")
    assert [json.loads(chunk.split("data: ", 1)[1])["sequence_number"] for chunk in started] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert responses.stream_error(reply, err) == [
        'event: error\ndata: {"type":"error","code":"generation_deadline_exceeded","message":'
        + DEADLINE_MESSAGE
        + ',"param":null,"sequence_number":5,"error":{"type":"timeout_error",'
        '"code":"generation_deadline_exceeded","message":' + DEADLINE_MESSAGE + ',"param":null}}\n\n'
    ]

    messages = AnthropicMessages().stream_error(Reply(id="msg_x", model=MODEL), err)
    assert messages == [
        'event: error\ndata: {"type":"error","error":{"type":"timeout_error","message":'
        + DEADLINE_MESSAGE
        + "}}\n\n"
    ]


@pytest.mark.parametrize(
    ("err", "status", "anthropic_type", "openai_type"),
    [
        (
            errors.ProtocolValidationError("bad", param="x"),
            400,
            "invalid_request_error",
            "invalid_request_error",
        ),
        (errors.InvalidAPIKey(), 401, "authentication_error", "authentication_error"),
        (errors.WrongCredentials(), 403, "permission_error", "invalid_request_error"),
        (errors.UnknownModel(), 404, "not_found_error", "invalid_request_error"),
        (errors.MethodNotAllowed(allowed=("POST",)), 405, "invalid_request_error", "invalid_request_error"),
        (failure(Ending.CANCELLED), 409, "conflict_error", "invalid_request_error"),
        (errors.PayloadTooLarge(), 413, "request_too_large", "invalid_request_error"),
        (failure(Ending.RESTARTS), 502, "api_error", "server_error"),
        (errors.UpstreamStreamInvalid(), 502, "api_error", "server_error"),
        (errors.ServiceUnavailable(), 503, "overloaded_error", "server_error"),
        (errors.GenerationDeadlineExceeded(), 504, "timeout_error", "timeout_error"),
    ],
)
def test_each_error_has_its_status_and_type_in_both_shapes_and_502_503_504_are_not_retried(
    err, status, anthropic_type, openai_type
):
    answer = AnthropicMessages().error_response(err)
    assert answer.status_code == status
    assert json.loads(answer.content) == {
        "type": "error",
        "error": {"type": anthropic_type, "message": err.message},
    }
    for protocol in (OpenAIChat(), OpenAIResponses()):
        openai_answer = protocol.error_response(err)
        assert openai_answer.status_code == status
        assert json.loads(openai_answer.content)["error"]["type"] == openai_type
    for response in (answer, OpenAIResponses().error_response(err)):
        assert response.get("x-should-retry") == ("false" if status in (502, 503, 504) else None)


def test_a_504_before_commitment_carries_the_deadline_code_in_the_openai_shapes():
    body = json.loads(OpenAIResponses().error_response(errors.GenerationDeadlineExceeded()).content)
    assert body["error"]["code"] == "generation_deadline_exceeded"
    assert body["error"]["type"] == "timeout_error"


def test_a_responses_stream_repeats_the_whole_text_when_it_ends():
    responses = OpenAIResponses()
    reply = Reply(id="resp_abc", model=MODEL)
    chunks = responses.stream_start(reply)
    for delta in DELTAS:
        chunks += responses.stream_delta(reply, delta)
    chunks += responses.stream_end(reply, "stop", Usage(7, 20))
    events = [json.loads(chunk.split("data: ", 1)[1]) for chunk in chunks]
    assert [event["type"] for event in events] == RESPONSES_STREAM
    assert all(
        chunk.startswith(f"event: {event['type']}\n") for chunk, event in zip(chunks, events, strict=True)
    )
    assert events[-4]["text"] == TEXT
    assert events[-1]["response"]["usage"]["total_tokens"] == 27
    assert events[-1]["response"]["output"][0]["id"] == "msg_abc"
    assert time.time() - events[0]["response"]["created_at"] < 60
