"""The clocks: the one wall clock that lease logic reads (tests move it with time-machine), and
the monotonic arrival time that generation deadlines count from."""

import time
from datetime import datetime

from django.utils import timezone

# Where a request's arrival is kept: the ASGI scope's key, or, outside ASGI, the request's.
ARRIVED_KEY = "hordeops.arrived"


def now() -> datetime:
    return timezone.now()


def arrived_scope(scope: dict) -> dict:
    """The ASGI scope with its arrival stamped: the first thing the app does with a request."""
    return {**scope, ARRIVED_KEY: time.monotonic()}


def arrived(request) -> float:
    """The monotonic time the request reached the app.

    Stamped on the ASGI scope by `hordeops.asgi` before the body is read; a request that came
    another way (WSGI, Django's test client) is stamped here, the first time this is asked,
    by the first middleware (`hordeops.api.BodyLimitMiddleware`).
    """
    scope = getattr(request, "scope", None) or {}
    if ARRIVED_KEY in scope:
        return scope[ARRIVED_KEY]
    if not hasattr(request, "_hordeops_arrived"):
        request._hordeops_arrived = time.monotonic()
    return request._hordeops_arrived
