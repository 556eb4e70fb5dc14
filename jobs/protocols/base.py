"""What every client chat protocol shares: the call and reply types, the SSE encoding, the
input helpers and `ChatProtocol`, the base each protocol (a module each, beside this one)
fills in.

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
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hordeops import errors, metrics
from jobs.serializers import (
    HotInput,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    check_logit_bias,
    logit_bias_field,
)

MAX_REPLY_TOKENS = 16384
# OpenAI's `n` on the /v1 routes that take it: each choice is a job of its own.
MAX_CHOICES = 8
MAX_MESSAGES = 1000
# The horde's own bounds on `stop_sequence` (as on the text routes' `params`).
MAX_STOP_SEQUENCES = 128
MAX_STOP_SEQUENCE_CHARS = 2000
# How many fallback models a request may list (OpenRouter's `models`).
MAX_FALLBACK_MODELS = 8


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat request, whatever protocol it came in."""

    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None  # None: the most the model's online workers accept
    stream: bool
    params: dict[str, Any]
    prompt: str | None = None  # a text completion's prompt, in place of messages
    max_tokens_field: str = "max_tokens"  # the field the client set it in, for a refusal's `param`
    models: tuple[str, ...] = ()  # OpenRouter's fallbacks: other models that may serve it, in order
    n: int = 1  # choices wanted: a job each (OpenAI's `n`)
    # The capabilities its worker must declare, each with the field that needs it
    # (`jobs.protocols.agents.needs`): tools, structured output.
    needs: dict[str, str] = field(default_factory=dict)


@dataclass
class Reply:
    """What a protocol needs to know to write one reply, and what it has written of it so far."""

    id: str
    model: str
    prompt_tokens: int = 0
    n: int = 1  # choices
    created: int = field(default_factory=lambda: int(time.time()))
    # The next `sequence_number`, for a protocol that numbers its stream events (Responses).
    sequence: int = 0
    # The text sent in stream deltas so far, for a protocol that repeats it at the end.
    streamed: list[str] = field(default_factory=list)
    # The reply's tool calls, whole (`jobs.protocols.agents`' form), once it is done.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # A stream's tool calls as they came so far, by index: their id, name and arguments.
    streamed_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    # What a protocol keeps of its own stream (Messages: which content block is open).
    protocol_state: dict[str, Any] = field(default_factory=dict)

    def next_sequence(self) -> int:
        number = self.sequence
        self.sequence += 1
        return number


@dataclass(frozen=True)
class Choice:
    """One finished reply of a request's `n`."""

    text: str
    finish_reason: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # What the generation cost the requester (`kudos.earning`), beside the tokens as the AI
    # Horde would answer it: a key more in each protocol's usage, which their SDKs keep.
    kudos: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def note_pieces(reply: Reply, pieces: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """Add tool-call pieces to what `reply` streamed of its calls; each piece with whether it
    begins its call (its index was not seen before)."""
    noted = []
    for piece in pieces:
        index = piece["index"]
        first = index not in reply.streamed_calls
        call = reply.streamed_calls.setdefault(index, {"id": f"call_{index}", "name": "", "arguments": ""})
        function = piece.get("function") or {}
        if first and piece.get("id"):
            call["id"] = piece["id"]
        if first and function.get("name"):
            call["name"] = function["name"]
        call["arguments"] += function.get("arguments", "")
        noted.append((piece, first))
    return noted


def sse(data: Any, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def snake(code: str) -> str:
    """`InvalidAPIKey` -> `invalid_api_key`, `InvalidJSON` -> `invalid_json`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", code).lower()


def joined_text(value: Any, part_types: tuple[str, ...]) -> str | None:
    """A string, or the text of a list of `{"type": <one of part_types>, "text": str}` parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(part, dict) and part.get("type") in part_types and isinstance(part.get("text"), str)
        for part in value
    ):
        return "".join(part["text"] for part in value)
    return None


def text_content_schema(part_types: tuple[str, ...]) -> dict[str, Any]:
    """The schema of what `joined_text` reads: a string, or a list of text parts."""
    part = {
        "type": "object",
        "properties": {"type": {"type": "string", "enum": list(part_types)}, "text": {"type": "string"}},
        "required": ["type", "text"],
    }
    return {"oneOf": [{"type": "string"}, {"type": "array", "items": part}]}


@extend_schema_field(text_content_schema(("text",)))
class TextContentField(serializers.JSONField):
    """A message's content: a string, or a list of `{"type": "text", "text"}` parts."""


class MessageInput(HotInput):
    role = serializers.ChoiceField(choices=["system", "developer", "user", "assistant", "tool"])
    content = TextContentField()

    def validate_content(self, value: Any) -> str:
        text = joined_text(value, ("text",))
        if text is None:
            raise serializers.ValidationError("content must be a string or a list of text parts.")
        return text


def stop_list(value: Any, *, max_items: int, what: str) -> list[str]:
    """OpenAI's `stop`: a string or a list of strings, each non-empty (an empty one would stop
    every reply at once), at most MAX_STOP_SEQUENCE_CHARS in all, as the horde route's."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > max_items or not all(isinstance(s, str) for s in stops):
        raise serializers.ValidationError(f"{what} must be a string or a list of up to {max_items} strings.")
    if not all(stops):
        raise serializers.ValidationError(f"{what} may not hold an empty string.")
    if sum(len(stop) for stop in stops) > MAX_STOP_SEQUENCE_CHARS:
        raise serializers.ValidationError(f"{what} may hold {MAX_STOP_SEQUENCE_CHARS} characters in all.")
    return stops


def first_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    """The first field and message of a DRF error tree, as OpenAI's `param` and message."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            # A list field's errors are keyed by the item's index, an int.
            name = None if key == "non_field_errors" else str(key)
            path = ".".join(p for p in (prefix, name) if p)
            return first_error(value, path)
    if isinstance(detail, list) and detail:
        for index, item in enumerate(detail):
            if item:
                if isinstance(item, (dict, list)):
                    return first_error(item, f"{prefix}.{index}" if prefix else str(index))
                return prefix or None, str(item)
    return prefix or None, str(detail)


def validated(serializer: serializers.Serializer) -> dict[str, Any]:
    if not serializer.is_valid():
        param, message = first_error(serializer.errors)
        raise errors.ProtocolValidationError(message, param=param)
    return serializer.validated_data


def fallbacks_field() -> serializers.ListField:
    """OpenRouter's `models`: the models that may serve the request if `model`'s workers cannot."""
    return serializers.ListField(
        child=StrictCharField(max_length=255),
        max_length=MAX_FALLBACK_MODELS,
        required=False,
        allow_null=True,
    )


def top_k_field() -> StrictIntegerField:
    """`top_k`, in the horde params' range (0: off)."""
    return StrictIntegerField(min_value=0, max_value=200, required=False, allow_null=True)


class SamplerInput(HotInput):
    """The sampling knobs beyond temperature and top_p that OpenRouter takes in an OpenAI body,
    in the horde params' ranges where the horde has the knob (`jobs.serializers.TextParamsInput`).

    A chat request's body, on the way to its first token: its fields are built once per class
    and thread (`HotInput`), for DRF's copy of them cost more than the rest of its validation."""

    top_k = top_k_field()
    min_p = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    typical_p = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    repetition_penalty = StrictFloatField(min_value=1, max_value=3, required=False, allow_null=True)
    frequency_penalty = StrictFloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    presence_penalty = StrictFloatField(min_value=-2, max_value=2, required=False, allow_null=True)
    logit_bias = logit_bias_field(allow_null=True)

    def validate_logit_bias(self, value: dict[str, float] | None) -> dict[str, float]:
        return check_logit_bias(value)


# A client's sampler name -> the horde params' (the AI Horde's KoboldAI names where it has the
# knob, OpenAI's where it has none), as the pop's payload carries them to the worker.
HORDE_SAMPLERS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical",
    "repetition_penalty": "rep_pen",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias",
}


def sampling(data: dict[str, Any], stops: list[str]) -> dict[str, Any]:
    """The horde `params` of a chat call: sampling knobs that were given, and stop strings."""
    params: dict[str, Any] = {
        horde: data[name]
        for name, horde in HORDE_SAMPLERS.items()
        if data.get(name) is not None and data[name] != {}
    }
    if data.get("seed") is not None:
        params["sampler_seed"] = data["seed"]  # the horde params' name for it
    if stops:
        params["stop_sequence"] = stops
    return params


class ChatProtocol:
    """What every protocol shares: the HTTP status of an error and its retry header."""

    path = ""
    # Where the client APIs' status for a case differs from the horde's.
    STATUS = {"UnknownModel": 404}

    def stream_tool_calls(self, reply: Reply, pieces: list[dict[str, Any]]) -> list[str]:
        """The stream's events for pieces of tool calls (OpenAI's stream form, by `index`);
        noted in `reply.streamed_calls`. A protocol that takes no tools relays none."""
        note_pieces(reply, pieces)
        return []

    def status_of(self, err: errors.DomainError) -> int:
        return self.STATUS.get(err.code, err.status)

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        raise NotImplementedError

    def error_response(self, err: errors.DomainError) -> JsonResponse:
        status = self.status_of(err)
        metrics.count_refusal(err)
        return JsonResponse(self.error_body(err), status=status, headers=errors.response_headers(err, status))
