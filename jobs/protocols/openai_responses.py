"""OpenAI Responses (`POST /v1/responses`), stateless: the whole conversation in each `input`."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors
from jobs.protocols.base import (
    MAX_MESSAGES,
    MAX_REPLY_TOKENS,
    ChatCall,
    Reply,
    SamplerInput,
    Usage,
    fallbacks_field,
    joined_text,
    sampling,
    sse,
    text_content_schema,
    validated,
)
from jobs.protocols.openai_errors import OpenAIErrors
from jobs.serializers import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField


@extend_schema_field(text_content_schema(("input_text", "output_text")))
class ResponseContentField(serializers.JSONField):
    """An input item's content: a string, or a list of input or output text parts."""


class ResponseItemInput(serializers.Serializer):
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
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["message"]},
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": text_content_schema(("input_text", "output_text")),
    },
    "required": ["role", "content"],
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
        items = ResponseItemInput(data=data, many=True)
        if not items.is_valid():
            raise serializers.ValidationError(items.errors)
        return [{"role": item["role"], "content": item["content"]} for item in items.validated_data]


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
        return ChatCall(
            model=data["model"],
            messages=messages,
            max_tokens=data.get("max_output_tokens"),
            max_tokens_field="max_output_tokens",
            stream=data["stream"],
            params=sampling(data, []),
            models=tuple(data.get("models") or ()),
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

    def stream_delta(self, reply: Reply, text: str, index: int = 0) -> list[str]:  # one choice: index 0
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
