"""Anthropic Messages (`POST /v1/messages`)."""

from typing import Any

from rest_framework import serializers

from hordeops import errors
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
    sampling,
    sse,
    top_k_field,
    validated,
)
from jobs.serializers import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField


class AnthropicMessageInput(MessageInput):
    role = serializers.ChoiceField(choices=["user", "assistant"])


class AnthropicMessagesInput(serializers.Serializer):
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
    STOP_REASONS = {"length": "max_tokens"}

    def parse(self, body: Any) -> ChatCall:
        try:
            data = validated(AnthropicMessagesInput(data=body))
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
            params=sampling(data, data.get("stop_sequences") or []),
            models=tuple(data.get("models") or ()),
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
            sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"),
            sse(message_delta, event="message_delta"),
            sse({"type": "message_stop"}, event="message_stop"),
        ]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        # No `message_stop` after an error: the stream simply ends.
        return [sse(self.error_body(err), event="error")]
