"""`GET /v1/models` and `GET /v1/models/{id}`: the models online chat workers serve now, in
OpenAI's list shape, or Anthropic's when the client sends `anthropic-version` (both SDKs'
`models.list()` and `models.retrieve()` call these paths). A chat request for a model not
listed here is refused 404 `model_not_found`, the same reading (`Worker.objects.chat_models`).
"""

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from hordeops import clock, errors
from hordeops.parsing import ascii_int
from jobs.chat import chat_caller
from jobs.protocols import PROTOCOLS, ChatProtocol
from workers.models import Worker

# Who "owns" a model in OpenAI's shape: the volunteers of the horde.
OWNED_BY = "horde"


def _is_anthropic(request: HttpRequest) -> bool:
    return "anthropic-version" in request.headers


def _protocol(request: HttpRequest) -> ChatProtocol:
    return PROTOCOLS["/v1/messages" if _is_anthropic(request) else "/v1/chat/completions"]


# What a model's online workers take, in OpenRouter's `supported_parameters` names, by the
# capability a worker declares: an agent framework reads them to pick a model that can serve it.
PARAMETERS = {
    "tools": ("tools", "tool_choice", "parallel_tool_calls"),
    "structured_outputs": ("response_format", "structured_outputs"),
}
BASE_PARAMETERS = ("max_tokens", "temperature", "top_p", "stop", "seed")


def _openai(model: str, served: tuple[datetime, frozenset[str]]) -> dict[str, Any]:
    created, capabilities = served
    parameters = [*BASE_PARAMETERS, *(p for name in sorted(capabilities) for p in PARAMETERS[name])]
    return {
        "id": model,
        "object": "model",
        "created": int(created.timestamp()),
        "owned_by": OWNED_BY,
        "supported_parameters": parameters,
    }


def _anthropic(model: str, served: tuple[datetime, frozenset[str]]) -> dict[str, Any]:
    created, _ = served
    return {
        "type": "model",
        "id": model,
        "display_name": model,
        "created_at": created.isoformat().replace("+00:00", "Z"),
    }


def _anthropic_page(request: HttpRequest, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Anthropic's cursor page: `limit` (1-1000, default 20), after `after_id` or before `before_id`."""
    limit = ascii_int(request.GET.get("limit", "20"), max_digits=4)
    if limit is None or not 1 <= limit <= 1000:
        raise errors.BadRequest("limit must be a whole number from 1 to 1000.")
    ids = [entry["id"] for entry in entries]
    start, end = 0, len(entries)
    if "after_id" in request.GET:
        start = ids.index(request.GET["after_id"]) + 1 if request.GET["after_id"] in ids else end
    if "before_id" in request.GET:
        end = ids.index(request.GET["before_id"]) if request.GET["before_id"] in ids else 0
        start = max(start, end - limit)
    page = entries[start:end][:limit]
    return {
        "data": page,
        "has_more": start + len(page) < end,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def _served(request: HttpRequest) -> dict[str, tuple[datetime, frozenset[str]]]:
    if request.method != "GET":
        raise errors.MethodNotAllowed(allowed=("GET",))
    chat_caller(request)
    return Worker.objects.chat_models(clock.now())


@csrf_exempt
def models(request: HttpRequest) -> HttpResponse:
    try:
        served = _served(request)
        if _is_anthropic(request):
            return JsonResponse(_anthropic_page(request, [_anthropic(m, c) for m, c in served.items()]))
        return JsonResponse({"object": "list", "data": [_openai(m, c) for m, c in served.items()]})
    except errors.DomainError as err:
        return _protocol(request).error_response(err)


@csrf_exempt
def model(request: HttpRequest, model_id: str) -> HttpResponse:
    try:
        served = _served(request)
        if model_id not in served:
            raise errors.UnknownModel(f"The model '{model_id[:255]}' is not served by any online worker.")
        shape = _anthropic if _is_anthropic(request) else _openai
        return JsonResponse(shape(model_id, served[model_id]))
    except errors.DomainError as err:
        return _protocol(request).error_response(err)
