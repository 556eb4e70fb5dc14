"""Anthropic Messages (`POST /v1/messages`)."""

import json
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
from jobs.protocols import agents
from jobs.protocols.base import (
    MAX_MESSAGES,
    MAX_REPLY_TOKENS,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    ChatCall,
    ChatProtocol,
    MessageInput,
    Reply,
    TextContentField,
    Usage,
    fallbacks_field,
    joined_text,
    note_pieces,
    sampling,
    sse,
    top_k_field,
    validated,
)
from jobs.serializers import (
    HotInput,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"type": {"type": "string", "enum": ["text", "tool_use", "tool_result"]}},
                    "required": ["type"],
                },
            },
        ]
    }
)
class BlocksField(serializers.JSONField):
    """A message's content: a string, or text, `tool_use` and `tool_result` blocks (`_turns`)."""


class AnthropicMessageInput(MessageInput):
    role = serializers.ChoiceField(choices=["user", "assistant"])
    content = BlocksField()

    def validate_content(self, value: Any) -> str | list[dict[str, Any]]:
        text = joined_text(value, ("text",))
        if text is not None:
            return text
        if not isinstance(value, list) or not all(
            isinstance(block, dict) and block.get("type") in ("text", "tool_use", "tool_result")
            for block in value
        ):
            raise serializers.ValidationError(
                "content must be a string or a list of text, tool_use and tool_result blocks."
            )
        return value


def _turns(message: dict[str, Any], param: str) -> list[dict[str, Any]]:
    """One Anthropic message as the job's (OpenAI's) messages: an assistant's `tool_use` blocks
    become its `tool_calls`, a user's `tool_result` blocks `tool` messages before its text."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    text = "".join(
        block["text"] for block in content if block["type"] == "text" and isinstance(block.get("text"), str)
    )
    if any(block["type"] == "text" and not isinstance(block.get("text"), str) for block in content):
        raise agents.Invalid("A text block needs its text.", param)
    if role == "assistant":
        if any(block["type"] == "tool_result" for block in content):
            raise agents.Invalid("tool_result blocks belong in a user message.", param)
        calls = [
            agents.tool_call(block.get("id"), block.get("name"), _input(block, param), param)
            for block in content
            if block["type"] == "tool_use"
        ]
        turn: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        return [{**turn, "tool_calls": calls}] if calls else [turn]
    if any(block["type"] == "tool_use" for block in content):
        raise agents.Invalid("tool_use blocks belong in an assistant message.", param)
    turns = [
        {"role": "tool", "tool_call_id": _result_id(block, param), "content": _result_text(block, param)}
        for block in content
        if block["type"] == "tool_result"
    ]
    if text or not turns:
        turns.append({"role": "user", "content": text})
    return turns


def _input(block: dict[str, Any], param: str) -> str:
    if not isinstance(block.get("input"), dict):
        raise agents.Invalid("A tool_use block's input must be an object.", param)
    return json.dumps(block["input"], separators=(",", ":"))


def _result_id(block: dict[str, Any], param: str) -> str:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise agents.Invalid("A tool_result block needs the tool_use_id it answers.", param)
    return tool_use_id


def _result_text(block: dict[str, Any], param: str) -> str:
    text = joined_text(block.get("content", ""), ("text",))
    if text is None:
        raise agents.Invalid("A tool_result's content must be a string or text blocks.", param)
    return f"Error: {text}" if block.get("is_error") is True else text


def _tools(value: Any) -> list[dict[str, Any]]:
    """Anthropic's client tools (`{"name", "description", "input_schema"}`) as function tools."""
    if not isinstance(value, list) or len(value) > agents.MAX_TOOLS:
        raise agents.Invalid(f"tools must be a list of at most {agents.MAX_TOOLS} tools.", "tools")
    tools = []
    for index, tool in enumerate(value):
        where = f"tools.{index}"
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            raise agents.Invalid("Only client tools (name, description, input_schema) are served.", where)
        if not isinstance(tool.get("input_schema"), dict):
            raise agents.Invalid("A tool needs its input_schema.", f"{where}.input_schema")
        tools.append(
            agents.function_tool(tool.get("name"), tool.get("description"), tool["input_schema"], None, where)
        )
    return agents.unique(tools, "tools")


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, bool | None]:
    """Anthropic's `tool_choice` as OpenAI's, and `parallel_tool_calls` from its
    `disable_parallel_tool_use`."""
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise agents.Invalid("tool_choice's type must be 'auto', 'any', 'tool' or 'none'.", "tool_choice")
    parallel = None if "disable_parallel_tool_use" not in value else not value["disable_parallel_tool_use"]
    kind = value["type"]
    if kind in ("auto", "none"):
        return kind, parallel
    if not tools:
        raise agents.Invalid("tool_choice needs tools.", "tool_choice")
    if kind == "any":
        return "required", parallel
    return agents.named_choice(value.get("name"), tools, "tool_choice"), parallel


class AnthropicMessagesInput(HotInput):
    model = StrictCharField(max_length=255)
    models = fallbacks_field()  # OpenRouter's fallbacks, as on the OpenAI routes
    max_tokens = StrictIntegerField(min_value=1, max_value=MAX_REPLY_TOKENS)
    messages = AnthropicMessageInput(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    system = TextContentField(required=False, allow_null=True)
    stream = StrictBooleanField(default=False)
    temperature = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    top_k = top_k_field()
    stop_sequences = serializers.ListField(
        child=StrictCharField(allow_blank=False, trim_whitespace=False),
        max_length=MAX_STOP_SEQUENCES,
        required=False,
        allow_null=True,
    )
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)

    def validate_system(self, value: Any) -> str:
        if value is None:
            return ""
        text = joined_text(value, ("text",))
        if text is None:
            raise serializers.ValidationError("system must be a string or a list of text blocks.")
        return text

    def validate_stop_sequences(self, value: list[str] | None) -> list[str]:
        if value and sum(len(stop) for stop in value) > MAX_STOP_SEQUENCE_CHARS:
            raise serializers.ValidationError(
                f"stop_sequences may hold {MAX_STOP_SEQUENCE_CHARS} characters in all."
            )
        return value or []


class AnthropicMessages(ChatProtocol):
    """Anthropic Messages: `message` objects and `message_start` ... `message_stop`.

    Errors are `{"type": "error", "error": {"type", "message"}}`, typed by HTTP status. After
    commitment an error is one `error` event and the stream ends with no `message_stop`.
    """

    path = "/v1/messages"
    ERROR_TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        405: "invalid_request_error",
        408: "invalid_request_error",
        409: "conflict_error",
        413: "request_too_large",
        429: "rate_limit_error",
        502: "api_error",
        503: "overloaded_error",
        504: "timeout_error",
    }
    STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}

    def parse(self, body: Any) -> ChatCall:
        try:
            data = validated(AnthropicMessagesInput(data=body))
        except errors.ProtocolValidationError as err:
            # Anthropic names the field in the message: `messages.0.content: ...`.
            if err.param:
                err.message = f"{err.param}: {err.message}"
                err.args = (err.message,)
            raise
        try:
            messages = [
                turn
                for index, m in enumerate(data["messages"])
                for turn in _turns(dict(m), f"messages.{index}.content")
            ]
            tools = _tools(data["tools"]) if data.get("tools") else None
            choice, parallel = (None, None)
            if data.get("tool_choice") is not None:
                choice, parallel = _tool_choice(data["tool_choice"], tools)
        except agents.Invalid as err:
            raise errors.ProtocolValidationError(f"{err.param}: {err}", param=err.param) from None
        if data.get("system"):
            messages.insert(0, {"role": "system", "content": data["system"]})
        params = sampling(data, data.get("stop_sequences") or [])
        params.update(
            agents.agent_params(
                tools=tools, tool_choice=choice, parallel_tool_calls=parallel, response_format=None
            )
        )
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data["max_tokens"],
            stream=data["stream"],
            params=params,
            models=tuple(data.get("models") or ()),
            needs=agents.needs(params, messages),
        )

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        error_type = self.ERROR_TYPES.get(self.status_of(err), "api_error")
        return {"type": "error", "error": {"type": error_type, "message": err.message}}

    def reply_id(self, request_id: str) -> str:
        return f"msg_{request_id.replace('-', '')}"

    def _message(
        self, reply: Reply, content: list[dict[str, str]], stop_reason: str | None, usage: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": reply.id,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def _stop_reason(self, finish_reason: str) -> str:
        return self.STOP_REASONS.get(finish_reason, "end_turn")

    def _content(self, reply: Reply, text: str) -> list[dict[str, Any]]:
        """A text block (unless empty beside tool calls), then a `tool_use` block per call."""
        blocks: list[dict[str, Any]] = (
            [{"type": "text", "text": text}] if text or not reply.tool_calls else []
        )
        for call in reply.tool_calls:
            function = call["function"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": function["name"],
                    "input": _parsed(function["arguments"]),
                }
            )
        return blocks

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self._message(
            reply,
            self._content(reply, text),
            self._stop_reason(finish_reason),
            {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "kudos": usage.kudos,
            },
        )

    def stream_start(self, reply: Reply) -> list[str]:
        # The prompt's token count is not known here; `message_delta` carries it at the end.
        started = self._message(reply, [], None, {"input_tokens": reply.prompt_tokens, "output_tokens": 0})
        return [
            sse({"type": "message_start", "message": started}, event="message_start"),
            sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                event="content_block_start",
            ),
            sse({"type": "ping"}, event="ping"),
        ]

    def stream_delta(self, reply: Reply, text: str, index: int = 0) -> list[str]:  # one choice: index 0
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return [sse(delta, event="content_block_delta")]

    def stream_tool_calls(self, reply: Reply, pieces: list[dict[str, Any]]) -> list[str]:
        """Each call a `tool_use` block after the text block (index 0, closed at the first
        call): `content_block_start` with its id and name, then `input_json_delta` fragments."""
        events = []
        for piece, first in note_pieces(reply, pieces):
            block = 1 + piece["index"]
            if first:
                events += self._close_open_block(reply)
                call = reply.streamed_calls[piece["index"]]
                start = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}
                events.append(
                    sse(
                        {"type": "content_block_start", "index": block, "content_block": start},
                        event="content_block_start",
                    )
                )
                reply.protocol_state["open"] = block
            fragment = (piece.get("function") or {}).get("arguments", "")
            if fragment:
                delta = {"type": "input_json_delta", "partial_json": fragment}
                events.append(
                    sse(
                        {"type": "content_block_delta", "index": block, "delta": delta},
                        event="content_block_delta",
                    )
                )
        return events

    def _close_open_block(self, reply: Reply) -> list[str]:
        """The open block's stop: the text block (0) until a call began, then the last call's."""
        block = reply.protocol_state.get("open", 0)
        if block is None:
            return []
        reply.protocol_state["open"] = None
        return [sse({"type": "content_block_stop", "index": block}, event="content_block_stop")]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(finish_reason), "stop_sequence": None},
            "usage": {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "kudos": usage.kudos,
            },
        }
        return [
            *self._close_open_block(reply),
            sse(message_delta, event="message_delta"),
            sse({"type": "message_stop"}, event="message_stop"),
        ]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No `message_stop` after an error: the stream simply ends.
        return [sse(self.error_body(err), event="error")]


def _parsed(arguments: str) -> Any:
    """A call's arguments as the object Anthropic's `input` is (the horde checked them)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}
