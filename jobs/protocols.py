"""The client chat protocols: each parses its request and encodes replies, events and errors.

The relay core (`jobs.chat`) is the same for every protocol; a protocol only says how a
request looks and how each thing the core has to say is written on the wire.
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
    """What a protocol needs to know to write one reply."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))


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


class MessageInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant", "tool"])
    content = serializers.JSONField()

    def validate_content(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(
            isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            for part in value
        ):
            return "".join(part["text"] for part in value)
        raise serializers.ValidationError("content must be a string or a list of text parts.")


class ChatCompletionInput(serializers.Serializer):
    model = StrictCharField(max_length=255)
    messages = MessageInput(many=True, allow_empty=False, max_length=1000)
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
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
            raise serializers.ValidationError("stop must be a string or a list of up to 4 strings.")
        return stops


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


class OpenAIChat:
    """OpenAI Chat Completions: `chat.completion` objects and `chat.completion.chunk` events."""

    path = "/v1/chat/completions"

    def parse(self, body: Any) -> ChatCall:
        serializer = ChatCompletionInput(data=body)
        if not serializer.is_valid():
            param, message = _first_error(serializer.errors)
            raise errors.ProtocolValidationError(message, param=param)
        data = serializer.validated_data
        params: dict[str, Any] = {}
        if data.get("temperature") is not None:
            params["temperature"] = data["temperature"]
        if data.get("top_p") is not None:
            params["top_p"] = data["top_p"]
        if data.get("stop"):
            params["stop_sequence"] = data["stop"]
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens") or DEFAULT_REPLY_TOKENS
        return ChatCall(
            model=data["model"],
            messages=[dict(m) for m in data["messages"]],
            max_tokens=max_tokens,
            stream=data["stream"],
            params=params,
        )

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        if err.status >= 500:
            type_ = "timeout_error" if err.status == 504 else "server_error"
        elif err.status == 401:
            type_ = "authentication_error"
        else:
            type_ = "invalid_request_error"
        code = getattr(err, "openai_code", None) or self.CODES.get(err.code) or _snake(err.code)
        return {
            "error": {
                "message": err.message,
                "type": type_,
                "param": getattr(err, "param", None),
                "code": code,
            }
        }

    CODES = {"UnknownModel": "model_not_found"}
    # Where OpenAI's status for a case differs from the horde's.
    STATUS = {"UnknownModel": 404}

    def error_response(self, err: errors.DomainError) -> JsonResponse:
        response = JsonResponse(self.error_body(err), status=self.STATUS.get(err.code, err.status))
        if err.status in (502, 504):
            response["x-should-retry"] = "false"
        return response

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


class OpenAIResponses(OpenAIChat):
    """OpenAI Responses: `response` objects and `response.*` events. (To be written.)"""

    path = "/v1/responses"


class AnthropicMessages(OpenAIChat):
    """Anthropic Messages: `message` objects and `message_start` ... `message_stop`. (To be written.)"""

    path = "/v1/messages"


PROTOCOLS = {p.path: p() for p in (OpenAIChat, OpenAIResponses, AnthropicMessages)}


def protocol_for_path(path: str) -> OpenAIChat:
    return PROTOCOLS.get(path.rstrip("/"), PROTOCOLS[OpenAIChat.path])
