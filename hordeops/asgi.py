import asyncio
import contextvars
import os
import time
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")
django.setup(set_prefix=False)


# Set in the ASGI scope of a request whose view is sync.
SYNC_VIEW = "hordeops.sync_view"


class HordeASGIHandler(ASGIHandler):
    """Django's ASGI handler, with sync views served as under WSGI, on threads that last.

    Under ASGI, Django runs each `MiddlewareMixin` middleware's process_request and
    process_response through `sync_to_async` (23 thread hops a request with this project's
    middleware, counted in tests/hordeops/test_asgi.py), and each request's sync code on a
    thread made for that request (`ThreadSensitiveContext`). Together that is more CPU than
    the horde routes' own work. A
    sync view (the horde routes, the admin) gains nothing from the async chain, so it runs
    with the sync chain, in one hop to a long-lived pool of WEB_SYNC_THREADS threads, each
    closing its database connection after the request as WSGI's request signals would.
    Async views (the chat relays) keep Django's async path untouched.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sync_handler = BaseHandler()
        self._sync_handler.load_middleware(is_async=False)
        self._sync_threads = ThreadPoolExecutor(
            max_workers=settings.WEB_SYNC_THREADS, thread_name_prefix="hordeops-sync"
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not _is_async_view(_path_info(scope)):
            # No ThreadSensitiveContext: it would start a thread for this request only. The
            # mark tells get_response_async, so the path is resolved once per request.
            await self.handle({**scope, SYNC_VIEW: True}, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if not request.scope.get(SYNC_VIEW):
            return await super().get_response_async(request)
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._sync_threads, context.run, self._sync_response, request)

    def _sync_response(self, request: HttpRequest) -> HttpResponseBase:
        # The connection belongs to this thread: it is checked and given back here, as
        # request_started and request_finished do under WSGI (those signals run elsewhere).
        close_old_connections()
        try:
            return self._sync_handler.get_response(request)
        finally:
            close_old_connections()


def _path_info(scope) -> str:
    """The path the URLconf sees: the request path without the ASGI root path."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


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
