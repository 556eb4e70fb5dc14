"""OpenAI Responses (`POST /v1/responses`), stateless: the whole conversation in each `input`."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
from jobs.protocols import agents
from jobs.protocols.base import (
    MAX_MESSAGES,
    MAX_REPLY_TOKENS,
    ChatCall,
    Reply,
    SamplerInput,
    Usage,
    fallbacks_field,
    joined_text,
    note_pieces,
    sampling,
    sse,
    text_content_schema,
    validated,
)
from jobs.protocols.openai_errors import OpenAIErrors
from jobs.serializers import (
    HotInput,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)


@extend_schema_field(text_content_schema(("input_text", "output_text")))
class ResponseContentField(serializers.JSONField):
    """An input item's content: a string, or a list of input or output text parts."""


class ResponseItemInput(HotInput):
    """One item of `input`: a message whose content is a string or text parts."""

    type = serializers.ChoiceField(choices=["message"], required=False)
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant"])
    content = ResponseContentField()

    def validate_content(self, value: Any) -> str:
        text = joined_text(value, ("input_text", "output_text"))
        if text is None:
            raise serializers.ValidationError(
                "content must be a string or a list of input_text or output_text parts."
            )
        return text


RESPONSE_ITEM_SCHEMA = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["message"]},
                "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
                "content": text_content_schema(("input_text", "output_text")),
            },
            "required": ["role", "content"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function_call"]},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string"},
            },
            "required": ["type", "call_id", "name", "arguments"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function_call_output"]},
                "call_id": {"type": "string"},
                "output": {"type": "string"},
            },
            "required": ["type", "call_id", "output"],
        },
    ]
}


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "description": "one user message"},
            {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_MESSAGES,
                "items": RESPONSE_ITEM_SCHEMA,
                "description": "message items",
            },
        ]
    }
)
class ResponsesInputField(serializers.Field):
    """`input`: a string (one user message) or a list of message items."""

    default_error_messages = {
        "invalid": "input must be a string or a non-empty list of message items.",
        "too_many": f"input may hold at most {MAX_MESSAGES} items.",
    }

    def to_internal_value(self, data: Any) -> list[dict[str, str]]:
        if isinstance(data, str):
            return [{"role": "user", "content": data}]
        if not isinstance(data, list) or not data:
            self.fail("invalid")
        if len(data) > MAX_MESSAGES:
            self.fail("too_many")
        messages: list[dict[str, Any]] = []
        for index, item in enumerate(data):
            kind = item.get("type") if isinstance(item, dict) else None
            try:
                if kind == "function_call":
                    call = agents.tool_call(
                        item.get("call_id"), item.get("name"), item.get("arguments"), str(index)
                    )
                    last = messages[-1] if messages else {}
                    if last.get("role") == "assistant" and last.get("tool_calls"):
                        last["tool_calls"].append(call)  # a turn's calls come as items in a row
                    else:
                        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                    continue
                if kind == "function_call_output":
                    call_id, output = item.get("call_id"), joined_text(item.get("output"), ("input_text",))
                    if not isinstance(call_id, str) or not call_id or output is None:
                        raise agents.Invalid(
                            "A function_call_output needs its call_id and a string output.", ""
                        )
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
                    continue
            except agents.Invalid as err:
                raise serializers.ValidationError({index: [str(err)]}) from None
            one = ResponseItemInput(data=item)
            if not one.is_valid():
                raise serializers.ValidationError({index: one.errors})
            message = one.validated_data
            messages.append({"role": message["role"], "content": message["content"]})
        return messages


class ResponsesInput(SamplerInput):
    model = StrictCharField(max_length=255)
    models = fallbacks_field()
    input = ResponsesInputField()
    instructions = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    max_output_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True
    )
    stream = StrictBooleanField(default=False)
    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = StrictBooleanField(required=False, allow_null=True)
    text = serializers.JSONField(required=False, allow_null=True)


def _tools(value: Any) -> list[dict[str, Any]]:
    """Responses' function tools (`{"type": "function", "name", "parameters", ...}`, flat)."""
    if not isinstance(value, list) or len(value) > agents.MAX_TOOLS:
        raise agents.Invalid(f"tools must be a list of at most {agents.MAX_TOOLS} tools.", "tools")
    tools = []
    for index, tool in enumerate(value):
        where = f"tools.{index}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise agents.Invalid("Only function tools are served: type must be 'function'.", where)
        tools.append(
            agents.function_tool(
                tool.get("name"), tool.get("description"), tool.get("parameters"), tool.get("strict"), where
            )
        )
    return agents.unique(tools, "tools")


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> Any:
    if isinstance(value, dict) and value.get("type") == "function":
        if not tools:
            raise agents.Invalid("tool_choice needs tools.", "tool_choice")
        return agents.named_choice(value.get("name"), tools, "tool_choice")
    return agents.openai_tool_choice(value, tools)


def _format(value: Any) -> dict[str, Any] | None:
    """`text.format` (`{"type": "json_schema", "name", "schema", "strict"}`, flat) as Chat
    Completions' `response_format`."""
    if not isinstance(value, dict):
        raise agents.Invalid("text must be an object.", "text")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise agents.Invalid(
            "text.format's type must be 'text', 'json_object' or 'json_schema'.", "text.format"
        )
    if fmt["type"] != "json_schema":
        return agents.openai_response_format(fmt, "text.format")
    return {"type": "json_schema", "json_schema": agents.json_schema(fmt, "text.format")}


class OpenAIResponses(OpenAIErrors):
    """OpenAI Responses: `response` objects and `response.*` events, numbered per reply.

    Errors are OpenAI's, as on Chat Completions. After commitment an error is one `error`
    event carrying the error's fields both flat (as documented) and nested under `error`
    (as OpenAI sends them, and the only form on which the `openai` SDK raises).
    """

    path = "/v1/responses"

    def parse(self, body: Any) -> ChatCall:
        data = validated(ResponsesInput(data=body))
        messages = list(data["input"])
        if data.get("instructions"):
            messages.insert(0, {"role": "system", "content": data["instructions"]})
        try:
            tools = _tools(data["tools"]) if data.get("tools") else None
            choice = None if data.get("tool_choice") is None else _tool_choice(data["tool_choice"], tools)
            response_format = None if data.get("text") is None else _format(data["text"])
        except agents.Invalid as err:
            raise errors.ProtocolValidationError(str(err), param=err.param) from None
        params = sampling(data, [])
        params.update(
            agents.agent_params(
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=data.get("parallel_tool_calls"),
                response_format=response_format,
            )
        )
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data.get("max_output_tokens"),
            max_tokens_field="max_output_tokens",
            stream=data["stream"],
            params=params,
            models=tuple(data.get("models") or ()),
            needs=agents.needs(params, messages),
        )

    def reply_id(self, request_id: str) -> str:
        return f"resp_{request_id.replace('-', '')}"

    def _item_id(self, reply: Reply) -> str:
        return f"msg_{reply.id.removeprefix('resp_')}"

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": []}

    def _item(self, reply: Reply, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self._item_id(reply),
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _response(
        self,
        reply: Reply,
        *,
        output: list[dict[str, Any]],
        finish_reason: str | None = None,
        usage: Usage | None = None,
    ) -> dict[str, Any]:
        if finish_reason is None:
            status, incomplete = "in_progress", None
        elif finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            status, incomplete = "completed", None
        return {
            "id": reply.id,
            "object": "response",
            "created_at": reply.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": None,
            "metadata": {},
            "model": reply.model,
            "output": output,
            "parallel_tool_calls": False,
            "temperature": None,
            "tool_choice": "none",
            "tools": [],
            "top_p": None,
            "usage": None if usage is None else self._response_usage(usage),
        }

    def _response_usage(self, usage: Usage) -> dict[str, Any]:
        return {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
            "kudos": usage.kudos,
        }

    def _final(
        self, reply: Reply, text: str, finish_reason: str, usage: Usage, *, streamed: bool = False
    ) -> dict[str, Any]:
        """The message item (left out when empty beside calls, unless a stream announced it),
        then a `function_call` item per call."""
        item_status = "incomplete" if finish_reason == "length" else "completed"
        output = [self._item(reply, item_status, [self._part(text)])]
        if reply.tool_calls and not text and not streamed:
            output = []
        output += [
            self._call_item(reply, index, call, "completed") for index, call in enumerate(reply.tool_calls)
        ]
        return self._response(reply, output=output, finish_reason=finish_reason, usage=usage)

    def _call_item(self, reply: Reply, index: int, call: dict[str, Any], status: str) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": f"fc_{index}_{reply.id.removeprefix('resp_')}",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
            "status": status,
        }

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self._final(reply, text, finish_reason, usage)

    def stream_tool_calls(self, reply: Reply, pieces: list[dict[str, Any]]) -> list[str]:
        """A call's first piece adds its `function_call` item (output 1 + its index, after the
        message); each fragment is a `response.function_call_arguments.delta`."""
        events = []
        for piece, first in note_pieces(reply, pieces):
            index = piece["index"]
            streamed = reply.streamed_calls[index]
            call = {"id": streamed["id"], "function": {"name": streamed["name"], "arguments": ""}}
            item = self._call_item(reply, index, call, "in_progress")
            if first:
                events.append(
                    self._event(reply, "response.output_item.added", output_index=1 + index, item=item)
                )
            fragment = (piece.get("function") or {}).get("arguments", "")
            if fragment:
                events.append(
                    self._event(
                        reply,
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=1 + index,
                        delta=fragment,
                    )
                )
        return events

    def _event(self, reply: Reply, type_: str, **fields: Any) -> str:
        return sse({"type": type_, "sequence_number": reply.next_sequence(), **fields}, event=type_)

    def _text_place(self, reply: Reply) -> dict[str, Any]:
        return {"item_id": self._item_id(reply), "output_index": 0, "content_index": 0}

    def stream_start(self, reply: Reply) -> list[str]:
        started = self._response(reply, output=[])
        return [
            self._event(reply, "response.created", response=started),
            self._event(reply, "response.in_progress", response=started),
            self._event(
                reply, "response.output_item.added", output_index=0, item=self._item(reply, "in_progress", [])
            ),
            self._event(reply, "response.content_part.added", **self._text_place(reply), part=self._part("")),
        ]

    def stream_delta(self, reply: Reply, text: str, index: int = 0) -> list[str]:  # one choice: index 0
        reply.streamed.append(text)
        return [
            self._event(
                reply, "response.output_text.delta", **self._text_place(reply), delta=text, logprobs=[]
            )
        ]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        text = "".join(reply.streamed)
        final = self._final(reply, text, finish_reason, usage, streamed=True)
        item, *calls = final["output"]
        place = self._text_place(reply)
        # `response.completed` even when the reply was cut at max_output_tokens (its status
        # then says `incomplete`): the SDK's stream helper only finishes on that event.
        events = [
            self._event(reply, "response.output_text.done", **place, text=text, logprobs=[]),
            self._event(reply, "response.content_part.done", **place, part=self._part(text)),
            self._event(reply, "response.output_item.done", output_index=0, item=item),
        ]
        for index, call in enumerate(calls):
            events += [
                self._event(
                    reply,
                    "response.function_call_arguments.done",
                    item_id=call["id"],
                    output_index=1 + index,
                    arguments=call["arguments"],
                ),
                self._event(reply, "response.output_item.done", output_index=1 + index, item=call),
            ]
        return [*events, self._event(reply, "response.completed", response=final)]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No `response.completed` after an error: the stream simply ends.
        error = self.error_object(err)
        event = {
            "type": "error",
            "code": error["code"],
            "message": error["message"],
            "param": error["param"],
            "sequence_number": reply.next_sequence(),
            "error": {
                "type": error["type"],
                "code": error["code"],
                "message": error["message"],
                "param": error["param"],
            },
        }
        return [sse(event, event="error")]
