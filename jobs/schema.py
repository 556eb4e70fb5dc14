"""The OpenAPI schema of what the jobs app serves outside DRF: the `/v1` chat routes (plain
async Django views, which drf-spectacular cannot see) described as schema-only views, added
to the endpoints by a preprocessing hook (`SPECTACULAR_SETTINGS`), and the parameters and
security requirements the routes share."""

import re

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.views import APIView

from jobs import deadlines
from jobs.protocols.anthropic_messages import AnthropicMessagesInput
from jobs.protocols.openai_chat import ChatCompletionInput
from jobs.protocols.openai_completions import CompletionInput
from jobs.protocols.openai_responses import ResponsesInput

# A /v1 key, in either header (the horde routes' are hordeops.serializers.APIKEY_AUTH).
CHAT_KEY = [{"bearer": []}, {"x-api-key": []}]

DEADLINE = OpenApiParameter(
    deadlines.HEADER,
    int,
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "The requester's budget in milliseconds for the whole generation, every phase included "
        "(docs/reference/generation_deadline.md)."
    ),
)

OPENAI_ERROR = inline_serializer(
    "OpenAIError",
    {
        "error": inline_serializer(
            "OpenAIErrorObject",
            {
                "message": serializers.CharField(),
                "type": serializers.CharField(),
                "param": serializers.CharField(allow_null=True),
                "code": serializers.CharField(allow_null=True),
            },
        )
    },
)
ANTHROPIC_ERROR = inline_serializer(
    "AnthropicError",
    {
        "type": serializers.CharField(),
        "error": inline_serializer(
            "AnthropicErrorObject", {"type": serializers.CharField(), "message": serializers.CharField()}
        ),
    },
)
STREAM = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="The reply; with `stream: true`, `text/event-stream` in the protocol's events.",
)
CODES = (400, 401, 404, 408, 409, 413, 429, 502, 503, 504)


def _chat_view(operation_id: str, body: type[serializers.Serializer], error) -> type[APIView]:
    class ChatRoute(APIView):
        @extend_schema(
            operation_id=operation_id,
            request=body,
            parameters=[DEADLINE],
            responses={200: STREAM, **{code: error for code in CODES}},
            auth=CHAT_KEY,
            tags=["v1"],
        )
        def post(self, request):  # pragma: no cover - described, never routed
            raise NotImplementedError

    return ChatRoute


MODEL_LIST = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="OpenAI's model list, or Anthropic's when the request has an `anthropic-version` header.",
)


class ModelsRoute(APIView):
    @extend_schema(
        operation_id="v1_models",
        responses={200: MODEL_LIST, **{code: OPENAI_ERROR for code in (400, 401, 429)}},
        auth=CHAT_KEY,
        tags=["v1"],
    )
    def get(self, request):  # pragma: no cover - described, never routed
        raise NotImplementedError


class ModelRoute(APIView):
    @extend_schema(
        operation_id="v1_model",
        parameters=[OpenApiParameter("model_id", str, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, **{code: OPENAI_ERROR for code in (401, 404, 429)}},
        auth=CHAT_KEY,
        tags=["v1"],
    )
    def get(self, request, model_id):  # pragma: no cover - described, never routed
        raise NotImplementedError


class CountTokensInput(AnthropicMessagesInput):
    """What `count_tokens` reads: a Messages body, with no `max_tokens` needed (one sent is
    ignored, as the route counts the prompt only)."""

    max_tokens = None


class CountTokensRoute(APIView):
    @extend_schema(
        operation_id="messages_count_tokens",
        description=(
            "The horde's estimate of the prompt's tokens (about four characters a token of the prompt "
            "the messages become, as the AI Horde counts), not the model's tokenizer. `max_tokens` "
            "is ignored."
        ),
        request=CountTokensInput,
        responses={
            200: inline_serializer("TokenCount", {"input_tokens": serializers.IntegerField()}),
            **{code: ANTHROPIC_ERROR for code in (400, 401, 413, 429)},
        },
        auth=CHAT_KEY,
        tags=["v1"],
    )
    def post(self, request):  # pragma: no cover - described, never routed
        raise NotImplementedError


# The /v1 routes hordeops/urls.py serves, each with the schema-only view that describes it.
ROUTES = (
    ("/v1/chat/completions", "POST", _chat_view("chat_completions", ChatCompletionInput, OPENAI_ERROR)),
    ("/v1/responses", "POST", _chat_view("responses", ResponsesInput, OPENAI_ERROR)),
    ("/v1/completions", "POST", _chat_view("completions", CompletionInput, OPENAI_ERROR)),
    ("/v1/messages", "POST", _chat_view("messages", AnthropicMessagesInput, ANTHROPIC_ERROR)),
    ("/v1/messages/count_tokens", "POST", CountTokensRoute),
    ("/v1/models", "GET", ModelsRoute),
    ("/v1/models/{model_id}", "GET", ModelRoute),
)


def bound_deadline_header(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: the deadline header's range, from the settings as the
    schema is made (1..GENERATION_DEADLINE_MAX_MS; any value while deadlines are disabled)."""
    maximum = settings.GENERATION_DEADLINE_MAX_MS
    bounded = {"type": "integer", "minimum": 1, "maximum": maximum} if maximum else {"type": "string"}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "header" and parameter.get("name") == deadlines.HEADER:
                    parameter["schema"] = dict(bounded)
    return result


def add_chat_routes(endpoints: list) -> list:
    """drf-spectacular preprocessing hook: describe the `/v1` routes too."""
    described = [
        (path, "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>.+)", path.lstrip("/")) + "$", method, view.as_view())
        for path, method, view in ROUTES
    ]
    return [*endpoints, *described]
