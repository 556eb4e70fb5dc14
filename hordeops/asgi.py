import os
import time

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")
django.setup(set_prefix=False)


class HordeASGIHandler(ASGIHandler):
    """Django's ASGI handler, with a sync view and its whole middleware chain in one thread hop.

    Under ASGI, Django runs each `MiddlewareMixin` middleware's process_request and
    process_response through `sync_to_async`: some 16 thread hops per request with this
    project's middleware, about 2.8 ms of CPU, more than the horde routes' own work. A sync
    view (the horde routes, the admin) gains nothing from the async chain, so it is run as
    under WSGI: the sync chain, in one hop to the thread Django's sync code uses. Async views
    (the chat relays) keep the async chain.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sync_handler = BaseHandler()
        self._sync_handler.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if _is_async_view(request.path_info):
            return await super().get_response_async(request)
        return await sync_to_async(self._sync_handler.get_response, thread_sensitive=True)(request)


def _is_async_view(path: str) -> bool:
    try:
        return iscoroutinefunction(get_resolver().resolve(path).func)
    except Resolver404:
        return False  # the 404 handler is sync


# The admin's few assets (CSS, its scripts, the lease countdown) are served by Django's own
# static handler under /static/, so that the stack needs nothing in front of it; a public
# deployment puts `collectstatic` output behind its reverse proxy instead. The API and chat
# routes never pass through it.
django_application = ASGIStaticFilesHandler(HordeASGIHandler())


async def application(scope, receive, send):
    """Django, with the monotonic arrival time stamped before the body is read.

    Generation deadlines (seed 003) count body reads and everything after them.
    """
    if scope["type"] == "http":
        scope = {**scope, "hordeops.arrived": time.monotonic()}
    await django_application(scope, receive, send)
