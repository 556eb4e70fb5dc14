"""OpenAI Chat Completions (`POST /v1/chat/completions`)."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
from jobs.protocols import agents
from jobs.protocols.base import (
    MAX_CHOICES,
    MAX_MESSAGES,
    MAX_REPLY_TOKENS,
    MAX_STOP_SEQUENCE_CHARS,
    ChatCall,
    Choice,
    MessageInput,
    Reply,
    SamplerInput,
    TextContentField,
    Usage,
    fallbacks_field,
    note_pieces,
    sampling,
    sse,
    stop_list,
    validated,
)
from jobs.protocols.openai_errors import OpenAIErrors
from jobs.serializers import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MAX_STOP_SEQUENCE_CHARS},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        ],
        "nullable": True,
        "description": f"at most {MAX_STOP_SEQUENCE_CHARS} characters in all",
    }
)
class StopField(serializers.JSONField):
    """OpenAI's `stop`: a string or up to 4 strings (`stop_list`)."""


class OpenAIInput(SamplerInput):
    """What OpenAI's Chat Completions and (legacy) Completions take alike: the model, the
    stream, the choices wanted (`n`, a job each), the sampling knobs (OpenAI's and OpenRouter's)
    and the stop strings."""

    model = StrictCharField(max_length=255)
    models = fallbacks_field()
    max_tokens = StrictIntegerField(min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True)
    stream = StrictBooleanField(default=False)
    n = StrictIntegerField(min_value=1, max_value=MAX_CHOICES, required=False, allow_null=True)
    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    seed = StrictIntegerField(min_value=0, max_value=2**31 - 1, required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)

    def validate_stop(self, value: Any) -> list[str]:
        return stop_list(value, max_items=4, what="stop")


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                    "required": ["name", "arguments"],
                },
            },
            "required": ["id", "type", "function"],
        },
    }
)
class ToolCallsField(serializers.JSONField):
    """An assistant message's earlier tool calls (`agents.tool_call`)."""


def _history_call(call: Any) -> dict[str, Any]:
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    return agents.tool_call(call.get("id"), function.get("name"), function.get("arguments"), "tool_calls")


class ChatMessageInput(MessageInput):
    """A Chat Completions message: text, and for agents an assistant's `tool_calls` (its
    content then may be null) and a `tool` message's `tool_call_id`."""

    content = TextContentField(allow_null=True, required=False)
    tool_calls = ToolCallsField(required=False, allow_null=True)
    tool_call_id = StrictCharField(max_length=256, required=False)
    name = StrictCharField(max_length=64, required=False)

    def validate_content(self, value: Any) -> str | None:
        return None if value is None else super().validate_content(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        role = attrs["role"]
        calls = attrs.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise serializers.ValidationError({"tool_calls": "Only an assistant message has tool_calls."})
            if not isinstance(calls, list) or not calls:
                raise serializers.ValidationError({"tool_calls": "tool_calls must be a non-empty list."})
            try:
                attrs["tool_calls"] = [_history_call(call) for call in calls]
            except agents.Invalid as err:
                raise serializers.ValidationError({"tool_calls": str(err)}) from None
        else:
            attrs.pop("tool_calls", None)
        if role == "tool" and not attrs.get("tool_call_id"):
            raise serializers.ValidationError(
                {"tool_call_id": "A tool message needs the tool_call_id it answers."}
            )
        attrs.setdefault("content", None)  # always there for the worker, null beside tool calls
        if attrs["content"] is None and not attrs.get("tool_calls"):
            raise serializers.ValidationError(
                {"content": "content is required (null only beside tool_calls)."}
            )
        return attrs


@extend_schema_field(
    {
        "type": "array",
        "maxItems": agents.MAX_TOOLS,
        "items": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": agents.NAME.pattern},
                        "description": {"type": "string"},
                        "parameters": {"type": "object", "description": "a JSON Schema"},
                        "strict": {"type": "boolean"},
                    },
                    "required": ["name"],
                },
            },
            "required": ["type", "function"],
        },
    }
)
class ToolsField(serializers.JSONField):
    """Function tools (`agents.openai_tools`)."""


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {"type": "object", "properties": {"name": {"type": "string"}}},
                },
            },
        ]
    }
)
class ToolChoiceField(serializers.JSONField):
    """`agents.openai_tool_choice`."""


@extend_schema_field(
    {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object"},
        },
        "required": ["type"],
    }
)
class ResponseFormatField(serializers.JSONField):
    """`agents.openai_response_format`."""


class ChatCompletionInput(OpenAIInput):
    messages = ChatMessageInput(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    max_completion_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True
    )
    tools = ToolsField(required=False, allow_null=True)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    parallel_tool_calls = StrictBooleanField(required=False, allow_null=True)
    response_format = ResponseFormatField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            tools = agents.openai_tools(attrs["tools"]) if attrs.get("tools") else None
            choice = attrs.get("tool_choice")
            attrs["tool_choice"] = None if choice is None else agents.openai_tool_choice(choice, tools)
            attrs["tools"] = tools
            fmt = attrs.get("response_format")
            attrs["response_format"] = None if fmt is None else agents.openai_response_format(fmt)
        except agents.Invalid as err:
            raise errors.ProtocolValidationError(str(err), param=err.param) from None
        return attrs


class OpenAIChat(OpenAIErrors):
    """OpenAI Chat Completions: `chat.completion` objects and `chat.completion.chunk` events."""

    path = "/v1/chat/completions"

    def parse(self, body: Any) -> ChatCall:
        data = validated(ChatCompletionInput(data=body))
        if data.get("tools") and (data.get("n") or 1) > 1:
            # A reply's tool calls are relayed as one choice's.
            raise errors.ProtocolValidationError("n above 1 is not served with tools.", param="n")
        field = "max_completion_tokens" if data.get("max_completion_tokens") else "max_tokens"
        messages = [dict(m) for m in data["messages"]]
        params = sampling(data, data.get("stop") or [])
        params.update(
            agents.agent_params(
                tools=data.get("tools"),
                tool_choice=data.get("tool_choice"),
                parallel_tool_calls=data.get("parallel_tool_calls"),
                response_format=data.get("response_format"),
            )
        )
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data.get(field),
            max_tokens_field=field,
            stream=data["stream"],
            params=params,
            models=tuple(data.get("models") or ()),
            n=data.get("n") or 1,
            needs=agents.needs(params, messages),
        )

    def _chunk(
        self, reply: Reply, delta: dict[str, str], finish_reason: str | None, index: int = 0
    ) -> dict[str, Any]:
        return {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}],
        }

    def stream_start(self, reply: Reply) -> list[str]:
        start = {"role": "assistant", "content": ""}
        return [sse(self._chunk(reply, start, None, index)) for index in range(reply.n)]

    def stream_delta(self, reply: Reply, text: str, index: int = 0) -> list[str]:
        return [sse(self._chunk(reply, {"content": text}, None, index))]

    def stream_choice_end(self, reply: Reply, index: int, finish_reason: str) -> list[str]:
        """One of several choices' end (n > 1): its finish_reason; the usage comes once, after all."""
        return [sse(self._chunk(reply, {}, finish_reason, index))]

    def stream_usage_end(self, reply: Reply, usage: Usage) -> list[str]:
        """The end of a stream of several choices: a chunk with no choice and the usage of all
        (as OpenAI's `stream_options.include_usage` ends one), then [DONE]."""
        final = {**self._chunk(reply, {}, None), "choices": [], "usage": self._usage(usage)}
        return [sse(final), sse("[DONE]")]

    def stream_tool_calls(self, reply: Reply, pieces: list[dict[str, Any]]) -> list[str]:
        """`delta.tool_calls`: a call's first piece with its id, type and name (as OpenAI
        begins one), the rest with their `index` and argument fragments."""
        calls = []
        for piece, first in note_pieces(reply, pieces):
            index = piece["index"]
            call: dict[str, Any] = {"index": index}
            function = dict(piece.get("function") or {})
            if first:
                call.update(id=reply.streamed_calls[index]["id"], type="function")
                function = {
                    "name": reply.streamed_calls[index]["name"],
                    "arguments": function.get("arguments", ""),
                }
            else:
                function.pop("name", None)
            call["function"] = function
            calls.append(call)
        return [sse(self._chunk(reply, {"tool_calls": calls}, None))] if calls else []

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        final = self._chunk(reply, {}, finish_reason)
        final["usage"] = self._usage(usage)
        return [sse(final), sse("[DONE]")]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No [DONE] after an error: the stream simply ends.
        return [sse(self.error_body(err))]

    def _usage(self, usage: Usage) -> dict[str, float]:
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "kudos": usage.kudos,
        }

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self.response_choices(reply, [Choice(text, finish_reason)], usage)

    def response_choices(self, reply: Reply, choices: list[Choice], usage: Usage) -> dict[str, Any]:
        """A whole answer of one or more choices, indexed in the order given."""
        return {
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [
                {
                    "index": index,
                    "message": self._message(reply, choice.text),
                    "logprobs": None,
                    "finish_reason": choice.finish_reason,
                }
                for index, choice in enumerate(choices)
            ],
            "usage": self._usage(usage),
        }

    def _message(self, reply: Reply, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if reply.tool_calls:
            # As OpenAI answers a call: no text is null, not "".
            message.update(content=text or None, tool_calls=reply.tool_calls)
        return message

    def reply_id(self, request_id: str) -> str:
        return f"chatcmpl-{request_id}"
