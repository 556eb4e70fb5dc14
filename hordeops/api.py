"""Request parsing and the horde error shape: `{"message": ..., "rc": ...}`."""

from collections.abc import Callable
from typing import Any

import redis.exceptions
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from hordeops import errors

VALIDATION_MESSAGE = "Input payload validation failed"


def horde_error(message: str, rc: str, status: int, **extra: Any) -> Response:
    return Response({"message": message, "rc": rc, **extra}, status=status)


def _flatten_errors(detail: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(detail, dict):
        flat: dict[str, str] = {}
        for key, value in detail.items():
            name = "payload" if key == "non_field_errors" and not prefix else key
            flat.update(_flatten_errors(value, f"{prefix}.{name}" if prefix else name))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "payload": " ".join(str(item) for item in detail)}
        flat = {}
        for index, item in enumerate(detail):
            flat.update(_flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)))
        return flat
    return {prefix or "payload": str(detail)}


def _camel(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))


def horde_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Map every error a horde route can raise to `{"message", "rc"}`."""
    from rest_framework.views import set_rollback

    set_rollback()
    if isinstance(exc, errors.DomainError):
        return horde_error(exc.message, exc.code, exc.status)
    if isinstance(exc, RequestDataTooBig):
        err = errors.PayloadTooLarge()
        return horde_error(err.message, err.code, err.status)
    if isinstance(exc, drf_exceptions.ValidationError):
        return horde_error(VALIDATION_MESSAGE, "ValidationError", 400, errors=_flatten_errors(exc.detail))
    if isinstance(exc, drf_exceptions.ParseError):
        return horde_error(str(exc.detail), errors.InvalidJSON.code, 400)
    if isinstance(exc, (DatabaseError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        err = errors.ServiceUnavailable()
        return horde_error(err.message, err.code, err.status)
    if isinstance(exc, drf_exceptions.APIException):
        code = exc.get_codes()
        rc = _camel(code) if isinstance(code, str) else "BadRequest"
        return horde_error(str(exc.detail), rc, exc.status_code)
    return None


def _is_api_path(path: str) -> bool:
    return path.startswith("/api/")


class BodyLimitMiddleware:
    """Refuse bodies over the limit before anything reads them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            too_big = int(length) > settings.MAX_REQUEST_BODY_BYTES
        except ValueError:
            return JsonResponse(
                {"message": "Content-Length is not a number.", "rc": "BadRequest"}, status=400
            )
        if too_big and _is_api_path(request.path):
            err = errors.PayloadTooLarge()
            return JsonResponse({"message": err.message, "rc": err.code}, status=err.status)
        return self.get_response(request)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return JsonResponse({"message": "Not found.", "rc": "NotFound"}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"message": "Internal server error.", "rc": "InternalError"}, status=500)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        err = errors.PayloadTooLarge()
        return JsonResponse({"message": err.message, "rc": err.code}, status=err.status)
    return JsonResponse({"message": "Bad request.", "rc": "BadRequest"}, status=400)


def request_not_found(request: HttpRequest, raw: str) -> HttpResponse:
    err = errors.RequestNotFound()
    return JsonResponse({"message": err.message, "rc": err.code}, status=err.status)
