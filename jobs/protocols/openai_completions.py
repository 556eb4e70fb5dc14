"""OpenAI (legacy) Completions (`POST /v1/completions`): a prompt in, text out.

It is served over a text job, which any worker of the model may take (a legacy worker answers
whole at its submit), so its stream has no start event and its deltas come as the job's
output reaches the horde."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
from jobs.protocols.base import ChatCall, Choice, Reply, Usage, sampling, sse, stop_list, validated
from jobs.protocols.openai_chat import OpenAIChat, OpenAIInput
from jobs.protocols.openai_errors import OpenAIErrors
from jobs.serializers import StrictBooleanField

MAX_PROMPT_CHARS = 1_000_000


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": MAX_PROMPT_CHARS},
            {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_PROMPT_CHARS},
                "minItems": 1,
                "maxItems": 1,
            },
        ],
        "description": "one prompt: a string, or a list of exactly one string",
    }
)
class PromptField(serializers.JSONField):
    """OpenAI's `prompt`: a string, or a list of one (a batch of several is not served)."""


@extend_schema_field({"type": "boolean", "enum": [False], "description": "echo is not served"})
class NoEchoField(StrictBooleanField):
    """OpenAI's `echo`: only false, for the reply holds the completion only."""


class CompletionInput(OpenAIInput):
    prompt = PromptField()
    echo = NoEchoField(default=False)

    def validate_prompt(self, value: Any) -> str:
        prompt = value[0] if isinstance(value, list) and len(value) == 1 else value
        if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS:
            raise serializers.ValidationError(
                f"prompt must be a string of at most {MAX_PROMPT_CHARS} characters, or a list of one."
            )
        return prompt

    def validate_stop(self, value: Any) -> list[str]:
        return stop_list(value, max_items=4, what="stop")

    def validate_echo(self, value: bool) -> bool:
        if value:
            raise serializers.ValidationError("echo is not served: the reply holds the completion only.")
        return value


class OpenAICompletions(OpenAIErrors):
    """OpenAI Completions: `text_completion` objects, and the same objects as stream chunks."""

    path = "/v1/completions"

    def parse(self, body: Any) -> ChatCall:
        data = validated(CompletionInput(data=body))
        return ChatCall(
            model=data["model"],
            messages=[],
            max_tokens=data.get("max_tokens"),
            stream=data["stream"],
            params=sampling(data, data.get("stop") or []),
            prompt=data["prompt"],
            models=tuple(data.get("models") or ()),
            n=data.get("n") or 1,
        )

    def _completion(
        self, reply: Reply, text: str, finish_reason: str | None, index: int = 0
    ) -> dict[str, Any]:
        return {
            "id": reply.id,
            "object": "text_completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}],
        }

    _usage = OpenAIChat._usage  # the same usage object as Chat Completions'

    def stream_start(self, reply: Reply) -> list[str]:
        return []

    def stream_delta(self, reply: Reply, text: str, index: int = 0) -> list[str]:
        return [sse(self._completion(reply, text, None, index))]

    def stream_choice_end(self, reply: Reply, index: int, finish_reason: str) -> list[str]:
        return [sse(self._completion(reply, "", finish_reason, index))]

    def stream_usage_end(self, reply: Reply, usage: Usage) -> list[str]:
        final = {**self._completion(reply, "", None), "choices": [], "usage": self._usage(usage)}
        return [sse(final), sse("[DONE]")]

    def stream_end(self, reply: Reply, finish_reason: str, usage: Usage) -> list[str]:
        final = self._completion(reply, "", finish_reason)
        final["usage"] = self._usage(usage)
        return [sse(final), sse("[DONE]")]

    def stream_error(self, reply: Reply, err: errors.DomainError) -> list[str]:
        return [sse(self.error_body(err))]  # then the stream just ends, with no [DONE]

    def response(self, reply: Reply, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self.response_choices(reply, [Choice(text, finish_reason)], usage)

    def response_choices(self, reply: Reply, choices: list[Choice], usage: Usage) -> dict[str, Any]:
        answer = self._completion(reply, "", None)
        answer["choices"] = [
            {"text": c.text, "index": i, "logprobs": None, "finish_reason": c.finish_reason}
            for i, c in enumerate(choices)
        ]
        return {**answer, "usage": self._usage(usage)}

    def reply_id(self, request_id: str) -> str:
        return f"cmpl-{request_id}"
