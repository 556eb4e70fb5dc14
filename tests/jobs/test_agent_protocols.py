"""Agents' fields as each protocol reads them, and the horde's judgement of a worker's reply to
them (`jobs.protocols.agents`): what is refused 400 with the field it names, what the job
carries to its worker, and which replies are the worker's failure."""

import pytest

from hordeops import errors
from jobs.protocols import AnthropicMessages, OpenAIChat, OpenAIResponses, agents

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}


def _refused(body: dict) -> str | None:
    with pytest.raises(errors.ProtocolValidationError) as refused:
        OpenAIChat().parse(body)
    return refused.value.param


def test_a_plain_chat_needs_nothing_and_carries_no_agent_fields():
    call = OpenAIChat().parse(BODY)
    assert call.needs == {} and call.messages == [{"role": "user", "content": "hi"}]
    assert not set(call.params) & {"tools", "tool_choice", "parallel_tool_calls", "response_format"}


def test_tools_a_choice_and_a_format_are_carried_in_openais_form_and_name_what_they_need():
    call = OpenAIChat().parse(
        {
            **BODY,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "parallel_tool_calls": False,
            "response_format": {"type": "json_object"},
        }
    )
    assert call.params["tools"] == [TOOL]
    assert call.params["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert call.params["parallel_tool_calls"] is False
    assert call.params["response_format"] == {"type": "json_object"}
    assert call.needs == {"tools": "tools", "structured_outputs": "response_format"}


def test_a_text_response_format_and_an_empty_tool_list_need_nothing():
    call = OpenAIChat().parse({**BODY, "tools": [], "response_format": {"type": "text"}})
    assert call.needs == {} and "response_format" not in call.params


def test_a_history_of_tool_calls_and_results_needs_tools_even_without_tools_sent():
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]  # fmt: skip
    call = OpenAIChat().parse({**BODY, "messages": history})
    assert call.needs == {"tools": "messages"}
    assert call.messages[1]["content"] is None and call.messages[2]["tool_call_id"] == "c1"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools.0.function"),
        ({"tools": [TOOL, TOOL]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
         "tools.0.function"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "n", "schema": {"type": "blob"}}}},
         "response_format.json_schema.schema"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0.tool_call_id"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}]},
         "messages.0.tool_calls"),
        ({"messages": [{"role": "assistant", "content": None,
                        "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
         "messages.0.tool_calls"),
    ],
)  # fmt: skip
def test_a_malformed_agent_field_is_refused_naming_the_field(extra, param):
    assert _refused({**BODY, **extra}) == param


PARAMS = {"tools": [{"type": "function", "function": {**TOOL["function"], "strict": True}}]}


def _call(arguments: str, name: str = "f") -> list[dict]:
    return agents.worker_calls(
        [{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]
    )


def test_a_reply_with_calls_of_offered_functions_and_json_object_arguments_is_accepted():
    agents.check_reply(PARAMS, "", _call('{"x": 1}'))
    agents.check_reply(PARAMS, "Some text beside.", _call("{}"))
    agents.check_reply({"response_format": {"type": "json_object"}}, '{"a": [1]}', [])
    agents.check_reply({**PARAMS, "tool_choice": "auto"}, "No call needed.", [])
    agents.check_reply({**PARAMS, "tool_choice": "required"}, "", _call("{}"))


@pytest.mark.parametrize(
    ("params", "text", "calls"),
    [
        (PARAMS, "", _call('{"x": ')),  # not JSON
        (PARAMS, "", _call("[1]")),  # not an object
        (PARAMS, "", _call('{"x": "one"}')),  # breaks a strict function's parameters
        (PARAMS, "", _call("{}", name="g")),  # a function the job did not offer
        ({}, "", _call("{}")),  # a job that offered no tools
        ({**PARAMS, "tool_choice": "required"}, "No call.", []),
        ({**PARAMS, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "", []),
        ({"tools": PARAMS["tools"] + [{"type": "function", "function": {"name": "g"}}],
          "tool_choice": {"type": "function", "function": {"name": "f"}}}, "", _call("{}", name="g")),
        ({"response_format": {"type": "json_object"}}, "Sure! {}", []),
        ({"response_format": {"type": "json_object"}}, "[1, 2]", []),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "n", "schema": {"type": "integer"}}}},
         '"seven"', []),
    ],
)  # fmt: skip
def test_a_reply_that_breaks_its_job_is_the_workers_failure(params, text, calls):
    with pytest.raises(agents.BadReply):
        agents.check_reply(params, text, calls)


def test_a_worker_call_without_an_id_gets_one_and_a_call_without_a_name_is_refused():
    assert agents.worker_calls([{"function": {"name": "f", "arguments": "{}"}}])[0]["id"] == "call_0"
    with pytest.raises(agents.BadReply):
        agents.worker_calls([{"function": {"arguments": "{}"}}])


ANTHROPIC = {"model": "m", "max_tokens": 32}
CLAUDE_TOOL = {"name": "f", "input_schema": {"type": "object"}}


def test_anthropic_tools_and_choices_are_carried_as_openais():
    call = AnthropicMessages().parse(
        {
            **ANTHROPIC,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CLAUDE_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        }
    )
    assert call.params["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert (call.params["tool_choice"], call.params["parallel_tool_calls"]) == ("required", False)
    assert call.needs == {"tools": "tools"}


def test_anthropic_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages():
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "t2", "content": "no such city", "is_error": True},
            {"type": "text", "text": "And tomorrow?"}]},
    ]  # fmt: skip
    call = AnthropicMessages().parse({**ANTHROPIC, "messages": history})
    assert call.messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}],
    }
    assert call.messages[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no such city"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert call.needs == {"tools": "messages"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [CLAUDE_TOOL], "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice"),
        ({"messages": [{"role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
         "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
         "messages.0.content"),
        ({"messages": [{"role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}]}]},
         "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages.0.content"),
    ],
)  # fmt: skip
def test_a_malformed_anthropic_agent_field_is_refused_naming_the_field(extra, param):
    body = {**ANTHROPIC, "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(errors.ProtocolValidationError) as refused:
        AnthropicMessages().parse(body)
    assert refused.value.param == param


RESPONSES = {"model": "m"}


def test_responses_function_tools_choice_and_text_format_are_carried_as_chat_completions():
    call = OpenAIResponses().parse(
        {
            **RESPONSES,
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        }
    )
    assert call.params["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert call.params["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert call.params["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}},
    }
    assert call.needs == {"tools": "tools", "structured_outputs": "response_format"}


def test_responses_function_call_items_in_a_row_are_one_assistant_turn_and_outputs_tool_messages():
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
    ]
    call = OpenAIResponses().parse({**RESPONSES, "input": items})
    assert [m["role"] for m in call.messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in call.messages[1]["tool_calls"]] == ["a", "b"]
    assert call.needs == {"tools": "messages"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
         "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "blob"}}}},
         "text.format.schema"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input.0"),
        ({"input": [{"type": "function_call", "call_id": "a", "name": "f"}]}, "input.0"),
    ],
)  # fmt: skip
def test_a_malformed_responses_agent_field_is_refused_naming_the_field(extra, param):
    with pytest.raises(errors.ProtocolValidationError) as refused:
        OpenAIResponses().parse({**RESPONSES, "input": "hi", **extra})
    assert refused.value.param == param
