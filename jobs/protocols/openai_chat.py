"""OpenAI Chat Completions (`POST /v1/chat/completions`)."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
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
    Usage,
    fallbacks_field,
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


class ChatCompletionInput(OpenAIInput):
    messages = MessageInput(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    max_completion_tokens = StrictIntegerField(
        min_value=1, max_value=MAX_REPLY_TOKENS, required=False, allow_null=True
    )


class OpenAIChat(OpenAIErrors):
    """OpenAI Chat Completions: `chat.completion` objects and `chat.completion.chunk` events."""

    path = "/v1/chat/completions"

    def parse(self, body: Any) -> ChatCall:
        data = validated(ChatCompletionInput(data=body))
        field = "max_completion_tokens" if data.get("max_completion_tokens") else "max_tokens"
        return ChatCall(
            model=data["model"],
            messages=[dict(m) for m in data["messages"]],
            max_tokens=data.get(field),
            max_tokens_field=field,
            stream=data["stream"],
            params=sampling(data, data.get("stop") or []),
            models=tuple(data.get("models") or ()),
            n=data.get("n") or 1,
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
                    "message": {"role": "assistant", "content": choice.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": choice.finish_reason,
                }
                for index, choice in enumerate(choices)
            ],
            "usage": self._usage(usage),
        }

    def reply_id(self, request_id: str) -> str:
        return f"chatcmpl-{request_id}"
