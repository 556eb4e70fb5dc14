"""Agents through the whole stack (issue 55): the openai SDK against `bin/stack`, the bridge
declaring `--tools --structured_outputs` in front of llama-cpp-python's server with its
`chatml-function-calling` format, whose grammars make even random weights answer a valid tool
call and JSON that fits its schema. The agent loop: a tool call, its result sent back, a final
answer, streamed and not; a reply held to a JSON schema; and a model whose only worker declares
no tools refuses a request with tools at once."""

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from tests.bridge.conftest import MODEL, Bridge, start_bridge, until
from tests.bridge.engine import Engine

pytestmark = pytest.mark.timeout(240)
CITIES = ["Oslo", "Paris"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            # An enum: the grammar then ends the string, where random weights might never.
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": CITIES}},
                "required": ["city"],
            },
        },
    }
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": CITIES}, "rain": {"type": "boolean"}},
    "required": ["city", "rain"],
    "additionalProperties": False,
}
PLAIN_MODEL = "openai/plain-tiny"


@pytest.fixture(scope="module")
def engine(model_file: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    server = Engine(model_file, chat_format="chatml-function-calling").start()
    try:
        yield server
    finally:
        if request.session.testsfailed:
            print(f"--- engine ---\n{server.output()[-5000:]}")
        server.stop()


@pytest.fixture
def agent_bridge(stack, engine, accounts, run_bridge) -> Bridge:
    return start_bridge(
        stack, engine, accounts["owner"], run_bridge, "agent-bridge", "--tools", "--structured_outputs"
    )


@pytest.fixture
def sdk(stack, accounts) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=accounts["requester"], max_retries=0, timeout=60)


def _tool_result(call) -> dict:
    city = json.loads(call.function.arguments)["city"]
    return {"role": "tool", "tool_call_id": call.id, "content": f"12 C and dry in {city}"}


def test_the_openai_sdks_agent_loop_runs_through_the_bridge_and_the_engine(agent_bridge, sdk):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice=NAMED, max_tokens=48, temperature=0
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments)["city"] in CITIES

    messages += [choice.message.model_dump(exclude_none=True), _tool_result(call)]
    final = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason in ("stop", "length")
    # Both jobs were the bridge's, submitted (its line comes once the horde answered its submit).
    submitted = rf"job \S+ \(chat, {MODEL}\): submitted"
    until(lambda: len(re.findall(submitted, agent_bridge.output())) == 2, message=agent_bridge.output())


def test_the_agent_loop_streamed_gets_tool_call_pieces_then_the_answers_text(agent_bridge, sdk):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            tool_choice=NAMED,
            max_tokens=48,
            temperature=0,
            stream=True,
        )
    )
    pieces = [piece for chunk in chunks if chunk.choices for piece in chunk.choices[0].delta.tool_calls or []]
    assert pieces and {piece.index for piece in pieces} == {0}
    first = pieces[0]
    assert first.id and first.function.name == "get_weather"
    arguments = "".join(piece.function.arguments or "" for piece in pieces)
    assert json.loads(arguments)["city"] in CITIES
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"

    call = {"id": first.id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": first.id, "content": "9 C and raining"},
    ]
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            tool_choice="none",
            max_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and not any(chunk.choices[0].delta.tool_calls for chunk in chunks if chunk.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_held_to_a_json_schema_fits_it(agent_bridge, sdk, stream):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "The weather, as JSON."}],
        response_format=response_format,
        max_tokens=48,
        temperature=0,
        stream=stream,
    )
    if stream:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in answer if chunk.choices)
    else:
        text = answer.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


def test_a_request_with_tools_for_a_model_whose_only_worker_declares_none_is_refused_at_once(
    stack, engine, accounts, run_bridge, sdk
):
    start_bridge(stack, engine, accounts["owner"], run_bridge, "plain-bridge", "--model", PLAIN_MODEL)
    started = time.monotonic()
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.chat.completions.create(
            model=PLAIN_MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, max_tokens=16
        )
    assert time.monotonic() - started < 1
    assert refused.value.code == "capability_not_served"
    # The same model without tools is served by the same worker.
    plain = sdk.chat.completions.create(
        model=PLAIN_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert plain.choices[0].message.content


def test_the_anthropic_sdk_gets_a_tool_use_block_from_the_engine(agent_bridge, stack, accounts):
    sdk = anthropic.Anthropic(base_url=stack.url, api_key=accounts["requester"], max_retries=0, timeout=60)
    tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    answer = sdk.messages.create(
        model=MODEL,
        max_tokens=48,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert answer.stop_reason == "tool_use"
    use = answer.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input["city"] in CITIES


def test_the_responses_api_gets_a_function_call_from_the_engine(agent_bridge, sdk):
    tool = {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}
    answer = sdk.responses.create(
        model=MODEL,
        input="Weather?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=48,
    )
    [call] = [item for item in answer.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in CITIES
