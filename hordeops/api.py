"""Request parsing and the horde error shape: `{"message": ..., "rc": ...}`."""

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis.exceptions
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, DataError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from hordeops import clock, errors, keys, metrics, ratelimit, timeouts

logger = logging.getLogger(__name__)

VALIDATION_MESSAGE = "Input payload validation failed"


def validated_body(serializer_class: type, request: Any) -> dict[str, Any]:
    """A route's JSON body, validated by `serializer_class`; a bad one raises DRF's
    ValidationError, which each API family shapes as its 400."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def horde_body(message: str, rc: str, **extra: Any) -> dict[str, Any]:
    """The horde family's one error envelope (the AI Horde's `{"message", "rc"}`)."""
    return {"message": message, "rc": rc, **extra}


def horde_error(message: str, rc: str, status: int, **extra: Any) -> Response:
    """The envelope as a DRF answer, for the horde routes' views and exception handler."""
    return Response(horde_body(message, rc, **extra), status=status)


def horde_json(err: errors.DomainError) -> JsonResponse:
    """The envelope of a domain error as a plain Django answer, outside DRF, with its headers."""
    metrics.count_refusal(err)
    return JsonResponse(
        horde_body(err.message, err.code, **err.extra),
        status=err.status,
        headers=errors.response_headers(err, err.status),
    )


# The error shape of each API family other than the horde's, by path prefix. An app registers
# its own when it is ready (jobs registers the chat protocols' for /v1/), so that this base
# module imports no app.
ERROR_SHAPES: dict[str, Callable[[str, errors.DomainError], HttpResponse]] = {}


def register_error_shape(prefix: str, shape: Callable[[str, errors.DomainError], HttpResponse]) -> None:
    ERROR_SHAPES[prefix] = shape


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


# What a route cannot do while PostgreSQL or Redis is away: a 503, not a 500.
UNAVAILABLE = (DatabaseError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def horde_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Map every error a horde route can raise to `{"message", "rc"}`."""
    from rest_framework.views import set_rollback

    set_rollback()
    if isinstance(exc, DataError):
        # A value PostgreSQL refuses that validation let through: the caller's input.
        logger.warning("database refused a value: %s", type(exc).__name__)
        return horde_error("A value in the request is out of range for the horde.", "BadRequest", 400)
    if isinstance(exc, UNAVAILABLE):
        # Only the class name: driver messages can quote the request's values.
        sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
        logger.error("service unavailable: %s %s", type(exc).__name__, sqlstate)
        exc = errors.ServiceUnavailable()  # with its headers, as every 503
    if isinstance(exc, errors.DomainError):
        metrics.count_refusal(exc)
        response = horde_error(exc.message, exc.code, exc.status, **exc.extra)
        for name, value in errors.response_headers(exc, exc.status).items():
            response[name] = value
        return response
    if isinstance(exc, RequestDataTooBig):
        err = errors.PayloadTooLarge()
        return horde_error(err.message, err.code, err.status)
    if isinstance(exc, drf_exceptions.ValidationError):
        return horde_error(VALIDATION_MESSAGE, "ValidationError", 400, errors=_flatten_errors(exc.detail))
    if isinstance(exc, drf_exceptions.ParseError):
        return horde_error(str(exc.detail), errors.InvalidJSON.code, 400)
    if isinstance(exc, drf_exceptions.APIException):
        code = exc.get_codes()
        rc = _camel(code) if isinstance(code, str) else "BadRequest"
        return horde_error(str(exc.detail), rc, exc.status_code)
    return None


def _is_api_path(path: str) -> bool:
    return path.startswith(("/api/", "/v1/"))


def error_response_for_path(path: str, err: errors.DomainError) -> HttpResponse:
    """A domain error in the error shape of the API family that serves `path`."""
    for prefix, shape in ERROR_SHAPES.items():
        if path.startswith(prefix):
            return shape(path, err)
    return horde_json(err)


def _unannounced_body_length(request: HttpRequest) -> int:
    """The size of a body sent without Content-Length (chunked), where it can be known.

    The ASGI handler has already spooled such a body to a file; WSGI never reads one.
    """
    stream = getattr(request, "_stream", None)
    if not isinstance(request, ASGIRequest) or stream is None:
        return 0
    try:
        size = stream.seek(0, os.SEEK_END)
        stream.seek(0)
    except (AttributeError, OSError, ValueError):
        return 0
    return size or 0


class BodyLimitMiddleware(MiddlewareMixin):
    """Refuse bodies over the limit before anything reads them."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        # Where no ASGI server stamped the arrival (WSGI, the test client), this is the
        # earliest point a generation deadline can start from.
        clock.arrived(request)
        if not _is_api_path(request.path):
            return None
        declared = request.META.get("CONTENT_LENGTH") or ""
        try:
            length = int(declared) if declared else 0
        except ValueError:
            length = -1
        if length < 0:
            return error_response_for_path(request.path, errors.BadRequest("Content-Length is not a number."))
        if not declared:
            length = _unannounced_body_length(request)
            if 0 < length <= settings.MAX_REQUEST_BODY_BYTES:
                # DRF reads no body without a Content-Length: give it the spooled body's size.
                request.META["CONTENT_LENGTH"] = str(length)
        if length > settings.MAX_REQUEST_BODY_BYTES:
            return error_response_for_path(request.path, errors.PayloadTooLarge())
        return None


class RateLimitMiddleware(MiddlewareMixin):
    """The address timeouts (hordeops.timeouts; the routes that queue are left to their
    admission), then the token buckets (hordeops.ratelimit), before any route's work; on the
    worker routes the buckets count only keys no account has, which each process remembers
    (`ratelimit.key_memory`)."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        path = request.path
        if ratelimit.is_unlimited_path(path):
            return None  # the operator's probe and metrics, static files: no address read
        address = ratelimit.request_address(request)
        if ratelimit.is_unreadable(address):
            # Fail closed: an address no limit can hold would escape its timeouts and buckets.
            return error_response_for_path(path, errors.UnreadableAddress())
        if timeouts.is_checked_path(path) and (refused := timeouts.refusal(address)):
            return error_response_for_path(path, refused)
        if ratelimit.is_worker_path(path):
            return self._worker_call(request)
        api_key = keys.requester_api_key(path, request.headers)
        wait = ratelimit.take(ratelimit.buckets(api_key=api_key, address=address))
        if wait:
            return error_response_for_path(path, errors.RateLimited(wait_seconds=wait))
        return None

    def _worker_call(self, request: HttpRequest) -> HttpResponse | None:
        """A worker route's call: refused before the database when its key is known to be bad
        or its address has spent its bucket on bad keys; else the route decides."""
        api_key = request.headers.get("apikey") or ""
        now = time.monotonic()
        memory = ratelimit.key_memory
        if not memory.blocking(now) and not memory.is_bad(api_key, now):
            return None  # the usual call: two look-ups in this process's memory
        address = ratelimit.address_bucket(ratelimit.request_address(request))
        if memory.is_blocked(address, api_key, now):
            return horde_json(errors.RateLimited(wait_seconds=1, refusal="bad_keys"))
        if memory.is_bad(api_key, now):
            return self._bad_key(address, now) or horde_json(errors.InvalidAPIKey())
        return None

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if ratelimit.is_worker_path(request.path):
            api_key = request.headers.get("apikey") or ""
            if response.status_code == errors.InvalidAPIKey.status:
                ratelimit.key_memory.bad(api_key, time.monotonic())
                address = ratelimit.address_bucket(ratelimit.request_address(request))
                return self._bad_key(address, time.monotonic()) or response
            if api_key and response.status_code < 400:
                ratelimit.key_memory.good(api_key)
        return response

    def _bad_key(self, address: str, now: float) -> HttpResponse | None:
        """Charge a bad key's call to its address: None while the bucket had a token, else the
        429, the address refused before the database until the bucket has refilled."""
        wait = ratelimit.take(ratelimit.address_buckets(address))
        if not wait:
            return None
        ratelimit.key_memory.block(address, now + wait)
        return horde_json(errors.RateLimited(wait_seconds=wait, refusal="bad_keys"))


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response_for_path(request.path, errors.NotFound())


def server_error(request: HttpRequest) -> HttpResponse:
    return error_response_for_path(request.path, errors.InternalError())


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        return horde_json(errors.PayloadTooLarge())
    return horde_json(errors.BadRequest("Bad request."))
