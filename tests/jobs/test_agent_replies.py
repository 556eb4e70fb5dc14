"""An agent's chat through a live server with the openai SDK (issue 55): the worker gets the
tools and the format in its pop, returns tool calls in its submit and in its progress posts,
and the requester gets them in Chat Completions' shapes. A worker whose calls or JSON break
what the job asked for is not relayed: its job goes to another worker."""

import json
import threading
import time
from typing import Any

import anthropic
import openai
import pytest

from jobs.models import Generation
from tests.live import ChatWorker
from workers.models import Worker

MODEL = "openai/agent-model-1B"
SDK_TIMEOUT_SECONDS = 20
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
            "strict": True,
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
}


@pytest.fixture
def agents(make_caller):
    return make_caller("agent-requester"), make_caller("agent-owner")


def _sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=SDK_TIMEOUT_SECONDS)


def _in_thread(call) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except Exception as exc:  # the test reads it
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _done(thread: threading.Thread, out: dict[str, Any]) -> Any:
    thread.join(SDK_TIMEOUT_SECONDS + 5)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_openai_sdks_agent_loop_gets_a_tool_call_then_sends_its_result_and_gets_the_answer(
    live_stack, agents
):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="agent", model=MODEL, tools=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"}]
    thread, out = _in_thread(
        lambda: sdk.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="auto")
    )
    job = worker.pop_job()
    assert job["payload"]["tools"] == TOOLS and job["payload"]["tool_choice"] == "auto"
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    first = _done(thread, out)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Oslo"},
    )

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "12 C"},
    ]
    thread, out = _in_thread(lambda: sdk.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS))
    job = worker.pop_job()
    history = job["payload"]["messages"]
    assert history[1]["tool_calls"] == [CALL] and history[1]["content"] is None
    assert history[2] == {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}
    assert worker.submit("It is 12 C in Oslo.").status_code == 200
    final = _done(thread, out)
    assert (final.choices[0].message.content, final.choices[0].finish_reason) == (
        "It is 12 C in Oslo.",
        "stop",
    )
    assert final.choices[0].message.tool_calls is None


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_tool_call_arguments_that_are_not_json_are_given_back_and_another_worker_answers(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    bad = ChatWorker(url, owner.api_key, name="bad-agent", model=MODEL, tools=True)
    good = ChatWorker(url, owner.api_key, name="good-agent", model=MODEL, tools=True)
    bad.pop(), good.pop()
    sdk = _sdk(url, requester.api_key)
    thread, out = _in_thread(
        lambda: sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=TOOLS,
            tool_choice="required",
        )
    )
    bad.pop_job()
    broken = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Os'}}
    refused = bad.submit("", tool_calls=[broken])
    assert (refused.status_code, refused.json()["rc"]) == (400, "ReplyBreaksJob"), refused.text
    assert Generation.objects.get(pk=bad.id).state == Generation.State.FAULTED
    assert Worker.objects.get(name="bad-agent").given_back == 1
    good.pop_job()
    assert good.submit("", tool_calls=[CALL]).status_code == 200
    answer = _done(thread, out)
    assert answer.choices[0].message.tool_calls[0].function.arguments == CALL["function"]["arguments"]


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_reply_that_breaks_the_requested_json_schema_is_given_back_and_a_fitting_one_is_answered(
    live_stack, agents
):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="json-agent", model=MODEL, structured_outputs=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }
    thread, out = _in_thread(
        lambda: sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather?"}], response_format=response_format
        )
    )
    job = worker.pop_job()
    assert job["payload"]["response_format"] == response_format
    # Two: a third give-back would end the request (TEXT_REQUEST_MAX_RESTARTS).
    for broken in ('{"city": "Oslo"}', '{"city": "Oslo", "degrees": "warm"}'):
        refused = worker.submit(broken)
        assert (refused.status_code, refused.json()["rc"]) == (400, "ReplyBreaksJob"), broken
        job = worker.pop_job()
    assert worker.submit('{"city": "Oslo", "degrees": 12}').status_code == 200
    answer = _done(thread, out)
    assert json.loads(answer.choices[0].message.content) == {"city": "Oslo", "degrees": 12}


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_request_with_tools_is_refused_within_a_second_when_the_models_workers_do_not_declare_them(
    live_stack, agents
):
    [url] = live_stack.urls
    requester, owner = agents
    ChatWorker(url, owner.api_key, name="plain", model=MODEL).pop()
    sdk = _sdk(url, requester.api_key)
    started = time.monotonic()
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS
        )
    assert time.monotonic() - started < 1
    assert refused.value.code == "capability_not_served"


PIECES = [
    (
        "",
        [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ],
    ),
    ("", [{"index": 0, "function": {"arguments": '{"city": '}}]),
    ("", [{"index": 0, "function": {"arguments": '"Oslo"'}}]),
]


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_streamed_tool_call_reaches_the_openai_sdk_as_delta_pieces_and_ends_with_tool_calls(
    live_stack, agents
):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="streaming-agent", model=MODEL, tools=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    thread, out = _in_thread(
        lambda: list(
            sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Weather in Oslo?"}],
                tools=TOOLS,
                stream=True,
            )
        )
    )
    worker.pop_job()
    for delta, pieces in PIECES:
        assert worker.progress(delta, tool_calls=pieces).status_code == 200
    # The submit's calls are whole: the stream owes their end ("}"), sent before it ends.
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    chunks = _done(thread, out)
    pieces = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    first, *rest = pieces
    assert (first.index, first.id, first.type, first.function.name) == (
        0,
        "call_1",
        "function",
        "get_weather",
    )
    assert all(piece.index == 0 and piece.id is None and not piece.function.name for piece in rest)
    arguments = "".join(piece.function.arguments or "" for piece in pieces)
    assert json.loads(arguments) == {"city": "Oslo"}
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_progress_post_with_a_malformed_tool_call_piece_is_refused_400(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="sloppy-agent", model=MODEL, tools=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    thread, out = _in_thread(
        lambda: sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS
        )
    )
    worker.pop_job()
    refused = worker.progress("", tool_calls=[{"function": {"arguments": "{"}}])  # no index
    assert refused.status_code == 400, refused.text
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    assert _done(thread, out).choices[0].finish_reason == "tool_calls"


ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def _anthropic(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=SDK_TIMEOUT_SECONDS)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_anthropic_sdk_gets_a_tool_use_block_and_sends_its_tool_result_back(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="claude-agent", model=MODEL, tools=True)
    worker.pop()
    sdk = _anthropic(url, requester.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"}]
    thread, out = _in_thread(
        lambda: sdk.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=messages,
            tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"},
        )
    )
    job = worker.pop_job()
    assert job["payload"]["tools"][0]["function"]["parameters"] == ANTHROPIC_TOOLS[0]["input_schema"]
    assert job["payload"]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert worker.submit("Let me look.", tool_calls=[CALL]).status_code == 200
    first = _done(thread, out)
    assert first.stop_reason == "tool_use"
    text, use = first.content
    assert (text.type, text.text) == ("text", "Let me look.")
    assert (use.type, use.id, use.name, use.input) == ("tool_use", "call_1", "get_weather", {"city": "Oslo"})

    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "12 C"}]},
    ]
    thread, out = _in_thread(
        lambda: sdk.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=ANTHROPIC_TOOLS)
    )
    job = worker.pop_job()
    history = job["payload"]["messages"]
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert history[1]["content"] == "Let me look."
    assert history[2] == {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}
    assert worker.submit("12 C in Oslo.").status_code == 200
    final = _done(thread, out)
    assert (final.stop_reason, final.content[0].text) == ("end_turn", "12 C in Oslo.")


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_anthropic_sdk_streams_a_tool_use_block_with_input_json_deltas(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="claude-streamer", model=MODEL, tools=True)
    worker.pop()
    sdk = _anthropic(url, requester.api_key)

    def stream() -> tuple[list, Any]:
        with sdk.messages.stream(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=ANTHROPIC_TOOLS,
        ) as events:
            seen = list(events)
            return seen, events.get_final_message()

    thread, out = _in_thread(stream)
    worker.pop_job()
    for delta, pieces in PIECES:
        assert worker.progress(delta, tool_calls=pieces).status_code == 200
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    events, final = _done(thread, out)
    types = [event.type for event in events]
    assert "content_block_start" in types and "input_json" in types
    starts = [event.content_block for event in events if event.type == "content_block_start"]
    assert [block.type for block in starts] == ["text", "tool_use"]
    assert (starts[1].id, starts[1].name) == ("call_1", "get_weather")
    assert final.stop_reason == "tool_use"
    assert final.content[-1].input == {"city": "Oslo"}


RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_responses_api_returns_a_function_call_item_and_takes_its_output_back(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="responses-agent", model=MODEL, tools=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    thread, out = _in_thread(
        lambda: sdk.responses.create(model=MODEL, input="Weather in Oslo?", tools=RESPONSES_TOOLS)
    )
    job = worker.pop_job()
    assert job["payload"]["tools"] == TOOLS
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    first = _done(thread, out)
    [call] = first.output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "call_1",
        "get_weather",
        CALL["function"]["arguments"],
    )

    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"},
    ]
    thread, out = _in_thread(
        lambda: sdk.responses.create(model=MODEL, input=history, tools=RESPONSES_TOOLS, stream=True)
    )
    job = worker.pop_job()
    assert job["payload"]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
    ]
    assert worker.progress("12 C", tokens=2).status_code == 200
    assert worker.submit("12 C in Oslo.").status_code == 200
    events = list(_done(thread, out))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "12 C in Oslo."


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_responses_api_streams_function_call_arguments(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="responses-streamer", model=MODEL, tools=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    thread, out = _in_thread(
        lambda: list(sdk.responses.create(model=MODEL, input="Weather?", tools=RESPONSES_TOOLS, stream=True))
    )
    worker.pop_job()
    for delta, pieces in PIECES:
        assert worker.progress(delta, tool_calls=pieces).status_code == 200
    assert worker.submit("", tool_calls=[CALL]).status_code == 200
    events = _done(thread, out)
    added = [
        e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"
    ]
    assert [(item.call_id, item.name) for item in added] == [("call_1", "get_weather")]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == CALL["function"]["arguments"]
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].arguments == CALL["function"]["arguments"]


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_responses_apis_text_format_holds_the_reply_to_its_schema(live_stack, agents):
    [url] = live_stack.urls
    requester, owner = agents
    worker = ChatWorker(url, owner.api_key, name="responses-json", model=MODEL, structured_outputs=True)
    worker.pop()
    sdk = _sdk(url, requester.api_key)
    text = {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}}
    thread, out = _in_thread(lambda: sdk.responses.create(model=MODEL, input="Weather?", text=text))
    job = worker.pop_job()
    assert job["payload"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }
    assert worker.submit("not json").json()["rc"] == "ReplyBreaksJob"
    worker.pop_job()
    assert worker.submit('{"city": "Oslo", "degrees": 3}').status_code == 200
    assert json.loads(_done(thread, out).output_text) == {"city": "Oslo", "degrees": 3}
