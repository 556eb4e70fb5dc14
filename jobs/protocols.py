"""The client chat protocols: each parses its request and encodes replies, events and errors.

The relay core (`jobs.chat`) is the same for every protocol; a protocol only says how a
request looks and how each thing the core has to say is written on the wire:

- `parse(body)` -> `ChatCall`, raising `ProtocolValidationError` for a body that does not fit;
- `reply_id(request_id)`, `response(...)` for a plain answer;
- `stream_start`, `stream_delta`, `stream_end`, `stream_error` for a stream: each returns the
  SSE chunks to send, in order;
- `error_response(err)` for any `DomainError` before anything was sent.
"""

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from django.http import JsonResponse
from rest_framework import serializers

from hordeops import errors
from jobs.serializers import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField

MAX_REPLY_TOKENS = 16384
DEFAULT_REPLY_TOKENS = 1024
MAX_MESSAGES = 1000
# The horde's own bounds on `stop_sequence` (as on the text routes' `params`).
MAX_STOP_SEQUENCES = 128
MAX_STOP_SEQUENCE_CHARS = 2000


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat request, whatever protocol it came in."""

    model: str
    messages: list[dict[str, str]]
    max_tokens: int
    stream: bool
    params: dict[str, Any]


@dataclass
class Reply:
    """What a protocol needs to know to write one reply, and what it has written of it so far."""

    id: str
    model: str
    prompt_tokens: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    # The next `sequence_number`, for a protocol that numbers its stream events (Responses).
    sequence: int = 0
    # The text sent in stream deltas so far, for a protocol that repeats it at the end.
    streamed: list[str] = field(default_factory=list)

    def next_sequence(self) -> int:
        number = self.sequence
        self.sequence += 1
        return number


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def sse(data: Any, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def _snake(code: str) -> str:
    """`InvalidAPIKey` -> `invalid_api_key`, `InvalidJSON` -> `invalid_json`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", code).lower()


def _joined_text(value: Any, part_types: tuple[str, ...]) -> str | None:
    """A string, or the text of a list of `{"type": <one of part_types>, "text": str}` parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(part, dict) and part.get("type") in part_types and isinstance(part.get("text"), str)
        for part in value
    ):
        return "".join(part["text"] for part in value)
    return None


class MessageInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant", "tool"])
    content = serializers.JSONField()

    def validate_content(self, value: Any) -> str:
        text = _joined_text(value, ("text",))
        if text is None:
            raise serializers.ValidationError("content must be a string or a list of text parts.")
        return text


def _stop_list(value: Any, *, max_items: int, what: str) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > max_items or not all(isinstance(s, str) for s in stops):
        raise serializers.ValidationError(f"{what} must be a string or a list of up to {max_items} strings.")
    return stops


class ChatCompletionInput(serializers.Serializer):
    model = StrictCharField(max_length=255)
    messages = MessageInput(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    max_tokens = StrictIntegerField(min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True)
    max_completion_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True
    )
    stream = StrictBooleanField(default=False)
    n = StrictIntegerField(min_value=1, max_value=1, required=False, allow_null=True)
    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    stop = serializers.JSONField(required=False, allow_null=True)

    def validate_stop(self, value: Any) -> list[str]:
        return _stop_list(value, max_items=4, what="stop")


def _first_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    """The first field and message of a DRF error tree, as OpenAI's `param` and message."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = None if key == "non_field_errors" else key
            path = ".".join(p for p in (prefix, name) if p)
            return _first_error(value, path)
    if isinstance(detail, list) and detail:
        for index, item in enumerate(detail):
            if item:
                if isinstance(item, (dict, list)):
                    return _first_error(item, f"{prefix}.{index}" if prefix else str(index))
                return prefix or None, str(item)
    return prefix or None, str(detail)


def _validated(serializer: serializers.Serializer) -> dict[str, Any]:
    if not serializer.is_valid():
        param, message = _first_error(serializer.errors)
        raise errors.ProtocolValidationError(message, param=param)
    return serializer.validated_data


def _sampling(data: dict[str, Any], stops: list[str]) -> dict[str, Any]:
    """The horde `params` of a chat call: sampling knobs that were given, and stop strings."""
    params: dict[str, Any] = {}
    if data.get("temperature") is not None:
        params["temperature"] = data["temperature"]
    if data.get("top_p") is not None:
        params["top_p"] = data["top_p"]
    if stops:
        params["stop_sequence"] = stops
    return params


class ChatProtocol:
    """What every protocol shares: the HTTP status of an error and its retry header."""

    path = ""
    # Where the client APIs' status for a case differs from the horde's.
    STATUS = {"UnknownModel": 404}

    def status_of(self, err: errors.DomainError) -> int:
        return self.STATUS.get(err.code, err.status)

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        raise NotImplementedError

    def error_response(self, err: errors.DomainError) -> JsonResponse:
        status = self.status_of(err)
        return JsonResponse(self.error_body(err), status=status, headers=errors.response_headers(err, status))


class OpenAIChat(ChatProtocol):
    """OpenAI Chat Completions: `chat.completion` objects and `chat.completion.chunk` events."""

    path = "/v1/chat/completions"
    CODES = {"UnknownModel": "model_not_found"}

    def parse(self, body: Any) -> ChatCall:
        data = _validated(ChatCompletionInput(data=body))
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens") or DEFAULT_REPLY_TOKENS
        return ChatCall(
            model=data["model"],
            messages=[dict(m) for m in data["messages"]],
            max_tokens=max_tokens,
            stream=data["stream"],
            params=_sampling(data, data.get("stop") or []),
        )

    def error_object(self, err: errors.DomainError) -> dict[str, Any]:
        """OpenAI's error object: `{"message", "type", "param", "code"}`."""
        status = err.status
        if status >= 500:
            type_ = "timeout_error" if status == 504 else "server_error"
        elif status == 401:
            type_ = "authentication_error"
        elif status == 429:
            type_ = "rate_limit_error"
        else:
            type_ = "invalid_request_error"
        code = getattr(err, "openai_code", None) or self.CODES.get(err.code) or _snake(err.code)
        return {"message": err.message, "type": type_, "param": getattr(err, "param", None), "code": code}

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        return {"error": self.error_object(err)}

    def _chunk(self, reply: Reply, delta: dict[str, str], finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def stream_start(self, reply: Reply) -> list[str]:
        return [sse(self._chunk(reply, {"role": "assistant", "content": ""}, None))]

    def stream_delta(self, reply: Reply, text: str) -> list[str]:
        return [sse(self._chunk(reply, {"content": text}, None))]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        final = self._chunk(reply, {}, finish_reason)
        final["usage"] = self._usage(usage)
        return [sse(final), sse("[DONE]")]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No [DONE] after an error: the stream simply ends.
        return [sse(self.error_body(err))]

    def _usage(self, usage: Usage) -> dict[str, int]:
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return {
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": self._usage(usage),
        }

    def reply_id(self, request_id: str) -> str:
        return f"chatcmpl-{request_id}"


# --- OpenAI Responses ---------------------------------------------------------------------


class ResponseItemInput(serializers.Serializer):
    """One item of `input`: a message whose content is a string or text parts."""

    type = serializers.ChoiceField(choices=["message"], required=False)
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant"])
    content = serializers.JSONField()

    def validate_content(self, value: Any) -> str:
        text = _joined_text(value, ("input_text", "output_text"))
        if text is None:
            raise serializers.ValidationError(
                "content must be a string or a list of input_text or output_text parts."
            )
        return text


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
        items = ResponseItemInput(data=data, many=True)
        if not items.is_valid():
            raise serializers.ValidationError(items.errors)
        return [{"role": item["role"], "content": item["content"]} for item in items.validated_data]


class ResponsesInput(serializers.Serializer):
    model = StrictCharField(max_length=255)
    input = ResponsesInputField()
    instructions = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    max_output_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True
    )
    stream = StrictBooleanField(default=False)
    temperature = StrictFloatField(min_value=0, max_value=2, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)


class OpenAIResponses(OpenAIChat):
    """OpenAI Responses: `response` objects and `response.*` events, numbered per reply.

    Errors are OpenAI's, as on Chat Completions. After commitment an error is one `error`
    event carrying the error's fields both flat (as documented) and nested under `error`
    (as OpenAI sends them, and the only form on which the `openai` SDK raises).
    """

    path = "/v1/responses"

    def parse(self, body: Any) -> ChatCall:
        data = _validated(ResponsesInput(data=body))
        messages = list(data["input"])
        if data.get("instructions"):
            messages.insert(0, {"role": "system", "content": data["instructions"]})
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data.get("max_output_tokens") or DEFAULT_REPLY_TOKENS,
            stream=data["stream"],
            params=_sampling(data, []),
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
        }

    def _final(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        item_status = "incomplete" if finish_reason == "length" else "completed"
        item = self._item(reply, item_status, [self._part(text)])
        return self._response(reply, output=[item], finish_reason=finish_reason, usage=usage)

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self._final(reply, text, finish_reason, usage)

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

    def stream_delta(self, reply: Reply, text: str) -> list[str]:
        reply.streamed.append(text)
        return [
            self._event(
                reply, "response.output_text.delta", **self._text_place(reply), delta=text, logprobs=[]
            )
        ]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        text = "".join(reply.streamed)
        final = self._final(reply, text, finish_reason, usage)
        [item] = final["output"]
        place = self._text_place(reply)
        # `response.completed` even when the reply was cut at max_output_tokens (its status
        # then says `incomplete`): the SDK's stream helper only finishes on that event.
        return [
            self._event(reply, "response.output_text.done", **place, text=text, logprobs=[]),
            self._event(reply, "response.content_part.done", **place, part=self._part(text)),
            self._event(reply, "response.output_item.done", output_index=0, item=item),
            self._event(reply, "response.completed", response=final),
        ]

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


# --- Anthropic Messages -------------------------------------------------------------------


class AnthropicMessageInput(MessageInput):
    role = serializers.ChoiceField(choices=["user", "assistant"])


class AnthropicMessagesInput(serializers.Serializer):
    model = StrictCharField(max_length=255)
    max_tokens = StrictIntegerField(min_value=1, max_value=MAX_REPLY_TOKENS)
    messages = AnthropicMessageInput(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    system = serializers.JSONField(required=False, allow_null=True)
    stream = StrictBooleanField(default=False)
    temperature = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    top_p = StrictFloatField(min_value=0.001, max_value=1, required=False, allow_null=True)
    stop_sequences = serializers.ListField(
        child=StrictCharField(allow_blank=False, trim_whitespace=False),
        max_length=MAX_STOP_SEQUENCES,
        required=False,
        allow_null=True,
    )

    def validate_system(self, value: Any) -> str:
        if value is None:
            return ""
        text = _joined_text(value, ("text",))
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
    STOP_REASONS = {"length": "max_tokens"}

    def parse(self, body: Any) -> ChatCall:
        try:
            data = _validated(AnthropicMessagesInput(data=body))
        except errors.ProtocolValidationError as err:
            # Anthropic names the field in the message: `messages.0.content: ...`.
            if err.param:
                err.message = f"{err.param}: {err.message}"
                err.args = (err.message,)
            raise
        messages = [dict(m) for m in data["messages"]]
        if data.get("system"):
            messages.insert(0, {"role": "system", "content": data["system"]})
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data["max_tokens"],
            stream=data["stream"],
            params=_sampling(data, data.get("stop_sequences") or []),
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

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self._message(
            reply,
            [{"type": "text", "text": text}],
            self._stop_reason(finish_reason),
            {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens},
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

    def stream_delta(self, reply: Reply, text: str) -> list[str]:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return [sse(delta, event="content_block_delta")]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(finish_reason), "stop_sequence": None},
            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens},
        }
        return [
            sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"),
            sse(message_delta, event="message_delta"),
            sse({"type": "message_stop"}, event="message_stop"),
        ]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No `message_stop` after an error: the stream simply ends.
        return [sse(self.error_body(err), event="error")]


PROTOCOLS: dict[str, ChatProtocol] = {p.path: p() for p in (OpenAIChat, OpenAIResponses, AnthropicMessages)}


def protocol_for_path(path: str) -> ChatProtocol:
    return PROTOCOLS.get(path.rstrip("/"), PROTOCOLS[OpenAIChat.path])
