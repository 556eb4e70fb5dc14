"""What an agent's request adds to a chat, in the one form the job carries to its worker
whatever protocol it came by: OpenAI Chat Completions' `tools`, `tool_choice`,
`parallel_tool_calls` and `response_format`, and tool calls as `{"id", "type": "function",
"function": {"name", "arguments"}}` (arguments a JSON text).

Each protocol reads its own shapes into these (`jobs.protocols.*`), and writes the calls a
worker returns back in its own shapes. `check_reply` is the horde's judgement of what a worker
returns for such a job: tool-call arguments that are not a JSON object, or a reply that is not
the JSON asked for, are the worker's failure (the job is given to another worker), not an answer.
"""

import json
import re
from typing import Any

import jsonschema

# OpenAI's own bounds: a function's name, and how many tools one request may send.
MAX_TOOLS = 128
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# The capabilities (`workers.declaration.CAPABILITIES`) a request needs, with the field that needs it.
TOOLS, STRUCTURED = "tools", "structured_outputs"


class Invalid(ValueError):
    """A request's agent field that does not fit: its message, and the field it names."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _object(value: Any, what: str, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(f"{what} must be an object.", param)
    return value


def function_tool(name: Any, description: Any, parameters: Any, strict: Any, param: str) -> dict[str, Any]:
    """One function tool in OpenAI's Chat Completions form, checked."""
    if not isinstance(name, str) or not NAME.match(name):
        raise Invalid("A function's name must be 1 to 64 letters, digits, underscores or dashes.", param)
    function: dict[str, Any] = {"name": name}
    if description is not None:
        if not isinstance(description, str):
            raise Invalid("A function's description must be a string.", param)
        function["description"] = description
    if parameters is not None:
        function["parameters"] = schema(parameters, param)
    if strict is not None:
        if not isinstance(strict, bool):
            raise Invalid("strict must be true or false.", param)
        function["strict"] = strict
    return {"type": "function", "function": function}


def schema(value: Any, param: str) -> dict[str, Any]:
    """A JSON Schema object, checked to be one (so that a reply can be judged against it)."""
    _object(value, "A JSON schema", param)
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as err:
        raise Invalid(f"Not a valid JSON schema: {err.message}", param) from None
    return value


def openai_tools(value: Any, param: str = "tools") -> list[dict[str, Any]]:
    """Chat Completions' `tools`: function tools (`{"type": "function", "function": {...}}`)."""
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise Invalid(f"tools must be a list of at most {MAX_TOOLS} tools.", param)
    tools = []
    for index, tool in enumerate(value):
        where = f"{param}.{index}"
        tool = _object(tool, "A tool", where)
        if tool.get("type") != "function":
            raise Invalid("Only function tools are served: type must be 'function'.", f"{where}.type")
        function = _object(tool.get("function"), "A tool's function", f"{where}.function")
        tools.append(
            function_tool(
                function.get("name"),
                function.get("description"),
                function.get("parameters"),
                function.get("strict"),
                f"{where}.function",
            )
        )
    return unique(tools, param)


def unique(tools: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) < len(names):
        raise Invalid("Each tool's name must be different.", param)
    return tools


def openai_tool_choice(value: Any, tools: list[dict[str, Any]] | None, param: str = "tool_choice") -> Any:
    """`none`, `auto`, `required`, or `{"type": "function", "function": {"name"}}` of a sent tool."""
    if value in ("none", "auto"):
        return value
    if value == "required" or isinstance(value, dict):
        if not tools:
            raise Invalid("tool_choice needs tools.", param)
        if value == "required":
            return value
        if value.get("type") != "function" or not isinstance(value.get("function"), dict):
            raise Invalid(
                "tool_choice must name a function: {'type': 'function', 'function': {'name'}}.", param
            )
        return named_choice(value["function"].get("name"), tools, param)
    raise Invalid("tool_choice must be 'none', 'auto', 'required' or a named function.", param)


def named_choice(name: Any, tools: list[dict[str, Any]], param: str) -> dict[str, Any]:
    if name not in {tool["function"]["name"] for tool in tools}:
        raise Invalid(f"tool_choice names a function that is not among the tools: {str(name)[:64]}.", param)
    return {"type": "function", "function": {"name": name}}


def openai_response_format(value: Any, param: str = "response_format") -> dict[str, Any] | None:
    """`{"type": "text"}` (None: nothing to ask), `json_object`, or `json_schema` with its
    `json_schema: {"name", "schema", "strict", "description"}`."""
    kind = _object(value, "response_format", param).get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise Invalid("response_format's type must be 'text', 'json_object' or 'json_schema'.", param)
    spec = _object(value.get("json_schema"), "response_format.json_schema", f"{param}.json_schema")
    return {"type": "json_schema", "json_schema": json_schema(spec, f"{param}.json_schema")}


def json_schema(spec: dict[str, Any], param: str) -> dict[str, Any]:
    """OpenAI's named schema: `name`, and `schema`, `strict`, `description` where given."""
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise Invalid(
            "The schema's name must be 1 to 64 letters, digits, underscores or dashes.", f"{param}.name"
        )
    out: dict[str, Any] = {"name": name}
    if spec.get("schema") is not None:
        out["schema"] = schema(spec["schema"], f"{param}.schema")
    if spec.get("strict") is not None:
        if not isinstance(spec["strict"], bool):
            raise Invalid("strict must be true or false.", f"{param}.strict")
        out["strict"] = spec["strict"]
    if isinstance(spec.get("description"), str):
        out["description"] = spec["description"]
    return out


def tool_call(id_: Any, name: Any, arguments: Any, param: str) -> dict[str, Any]:
    """A tool call in the history (an assistant's earlier turn), in OpenAI's form."""
    if not isinstance(id_, str) or not id_ or len(id_) > 256:
        raise Invalid("A tool call's id must be a string of 1 to 256 characters.", param)
    if not isinstance(name, str) or not NAME.match(name):
        raise Invalid(
            "A tool call's function name must be 1 to 64 letters, digits, underscores or dashes.", param
        )
    if not isinstance(arguments, str):
        raise Invalid("A tool call's arguments must be a string (JSON text).", param)
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def needs(params: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, str]:
    """The capabilities a chat needs, each with the field that needs it: tools (sent, or tool
    calls and results in its history: a server without tool support cannot render them), and
    structured output (a `response_format` that asks for JSON)."""
    needed: dict[str, str] = {}
    if params.get("tools"):
        needed[TOOLS] = "tools"
    elif any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        needed[TOOLS] = "messages"
    if params.get("response_format"):
        needed[STRUCTURED] = "response_format"
    return needed


def agent_params(
    *,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: dict[str, Any] | None,
) -> dict[str, Any]:
    """The job's payload fields for these (what its worker passes to its model server), the
    ones set; `tool_choice: "none"` keeps the tools (the history may name them)."""
    params: dict[str, Any] = {}
    if tools:
        params["tools"] = tools
        if tool_choice is not None:
            params["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            params["parallel_tool_calls"] = parallel_tool_calls
    if response_format:
        params["response_format"] = response_format
    return params


# --- A worker's reply to such a job -----------------------------------------------------------


class BadReply(ValueError):
    """A worker's reply that breaks what its job asked for: the job goes to another worker."""


MAX_CALLS = 128


def worker_calls(value: Any) -> list[dict[str, Any]]:
    """The tool calls a worker submits, in OpenAI's form, each checked: an id (made up where
    the worker gave none), a function name, arguments that are JSON text of an object."""
    if not isinstance(value, list) or len(value) > MAX_CALLS:
        raise BadReply(f"tool_calls must be a list of at most {MAX_CALLS} calls.")
    calls = []
    for index, call in enumerate(value):
        if not isinstance(call, dict):
            raise BadReply("Each tool call must be an object.")
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise BadReply("Each tool call needs a function name.")
        if not isinstance(arguments, str):
            raise BadReply("Each tool call's arguments must be JSON text.")
        id_ = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{index}"
        calls.append({"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def call_pieces(value: list[Any]) -> list[dict[str, Any]]:
    """Pieces of tool calls as a progress post streams them, in OpenAI's stream form: each
    `{"index"}` with any of `id`, `function.name` and a fragment of `function.arguments`."""
    pieces = []
    for piece in value:
        index = piece.get("index") if isinstance(piece, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_CALLS:
            raise BadReply(f"Each tool-call piece needs its call's index, 0 to {MAX_CALLS - 1}.")
        function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
        out: dict[str, Any] = {"index": index}
        if isinstance(piece.get("id"), str) and piece["id"]:
            out["id"] = piece["id"]
        named = {key: function[key] for key in ("name", "arguments") if isinstance(function.get(key), str)}
        if named:
            out["function"] = named
        pieces.append(out)
    return pieces


def rest_of_calls(streamed: dict[int, dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pieces a stream still owes of the final `calls`, beyond what it streamed (`streamed`,
    by index: id, name, arguments so far): whole calls it never began, the end of arguments it
    cut short. Arguments that differ from what was streamed cannot be unsent: their rest is
    all that can be said, and the submit's own are what a non-streamed answer gives."""
    pieces = []
    for index, call in enumerate(calls):
        function = call["function"]
        sent = streamed.get(index)
        if sent is None:
            pieces.append({"index": index, "id": call["id"], "type": "function", "function": dict(function)})
            continue
        arguments = function["arguments"]
        if arguments.startswith(sent.get("arguments", "")) and len(arguments) > len(
            sent.get("arguments", "")
        ):
            pieces.append(
                {"index": index, "function": {"arguments": arguments[len(sent.get("arguments", "")) :]}}
            )
    return pieces


def check_reply(params: dict[str, Any], text: str, calls: list[dict[str, Any]]) -> None:
    """Raise BadReply where a reply breaks its job: a call of a function not offered, or
    whose arguments are not a JSON object (or break a strict function's schema); no call where
    `tool_choice` required one, a call of another function than the one it named; a reply whose
    job asked for JSON that is not JSON (an object for json_object), or breaks the schema."""
    tools = {tool["function"]["name"]: tool["function"] for tool in params.get("tools") or []}
    if calls and not tools:
        raise BadReply("The reply calls tools, but the job offered none.")
    choice = params.get("tool_choice")
    if tools and choice not in (None, "auto", "none") and not calls:
        raise BadReply("The job's tool_choice required a tool call, and the reply made none.")
    if isinstance(choice, dict) and any(
        call["function"]["name"] != choice["function"]["name"] for call in calls
    ):
        raise BadReply("The job's tool_choice named one function, and the reply called another.")
    for call in calls:
        function = tools.get(call["function"]["name"])
        if function is None:
            raise BadReply("The reply calls a function the job did not offer.")
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            raise BadReply("A tool call's arguments are not JSON.") from None
        if not isinstance(arguments, dict):
            raise BadReply("A tool call's arguments are not a JSON object.")
        if function.get("strict") and function.get("parameters"):
            _fits(arguments, function["parameters"], "A tool call's arguments object")
    response_format = params.get("response_format")
    if not response_format or calls:
        return
    try:
        value = json.loads(text)
    except ValueError:
        raise BadReply("The reply is not the JSON its job asked for.") from None
    if response_format["type"] == "json_object" and not isinstance(value, dict):
        raise BadReply("The reply is not a JSON object.")
    spec = response_format.get("json_schema") or {}
    if spec.get("schema"):
        _fits(value, spec["schema"], "The reply")


def _fits(value: Any, schema_: dict[str, Any], what: str) -> None:
    validator = jsonschema.validators.validator_for(schema_)(schema_)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        raise BadReply(f"{what} does not fit the requested schema at {error.json_path}.")
