import asyncio
import functools
import logging
import os
import socket
import struct
import tempfile

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core import signals
from django.core.exceptions import ImproperlyConfigured, RequestAborted, SuspiciousFileOperation
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import Http404, HttpResponseBase
from django.urls import Resolver404, get_resolver, set_script_prefix
from django.utils.deprecation import MiddlewareMixin

from hordeops import asyncdb, clock, errors, streams

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")
django.setup(set_prefix=False)

logger = logging.getLogger(__name__)

if not settings.DEBUG and not settings.ALLOWED_HOSTS:
    # Every request would be a 400 (DisallowedHost): say why at the start instead.
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS is not set: set it to the host names this horde answers to "
        "(e.g. horde.example.org), or 127.0.0.1,localhost for a local stack"
    )


class HordeASGIHandler(ASGIHandler):
    """Django's ASGI handler, with sync views served as under WSGI, on threads that last.

    Checked against Django 5.2: the internals it calls or overrides (`read_body`,
    `create_request`, `send_response`, `handle`, `load_middleware`, the response's
    `_handler_class`) are pinned by tests/hordeops/test_asgi_django_internals.py.

    Under ASGI, Django runs each `MiddlewareMixin` middleware's process_request and
    process_response through `sync_to_async` (23 thread hops a request with this project's
    middleware, counted in tests/hordeops/test_asgi.py), its request signals and the
    response's close through more hops, and each request's sync code on a thread made for
    that request (`ThreadSensitiveContext`). Together that is more CPU than the horde routes'
    own work. A sync view (the horde routes, the admin) gains nothing from the async chain,
    so the request is served as WSGI serves it: request_started, the sync middleware chain,
    the view and the response's close (request_finished) in one hop to a long-lived pool of
    WEB_SYNC_THREADS threads, so that the database connection is checked and given back on
    the thread that used it. The event loop only reads the body and writes the answer.

    The pages (the admin's, and people's: `/account`) get the whole middleware chain; the API's
    paths (`API_PATHS`) skip what only pages use (`PAGE_ONLY_MIDDLEWARE`: sessions, CSRF,
    logins, messages): the API has none of them.

    A sync view may leave the end of its answer to the event loop: a response with a
    `finish_on_loop(receive)` coroutine function (a waiting pop, `jobs.views.TextPopView`) is
    sent once that returns true, after the thread, its database connection and the
    middleware are done with it; false means the client left, and nothing is sent.

    Async views (the chat relays) take Django's async path, but outside the per-request
    `ThreadSensitiveContext` that Django's `__call__` opens: that context gives each request
    a thread of its own, kept until its response ends, so every open stream would hold one.
    Without it, the few thread-sensitive hops Django makes (the request signals, a step that
    reads Redis) share asgiref's one process-wide thread, and the views' database steps run on
    `hordeops.asyncdb`'s threads. On the API's paths their chain is the API's middleware, and
    the steps that do no I/O (`ON_THE_LOOP`) run on the event loop: each hop stood between a
    chat and its first token.
    """

    def __init__(self) -> None:
        super().__init__()
        self._page_handler = _sync_handler(settings.MIDDLEWARE)
        self._api_handler = _sync_handler(
            [name for name in settings.MIDDLEWARE if name not in settings.PAGE_ONLY_MIDDLEWARE]
        )
        self._sync_threads = asyncdb.view_threads()
        self._api_async_handler = _loop_handler(
            [name for name in settings.MIDDLEWARE if name not in settings.PAGE_ONLY_MIDDLEWARE]
        )

    async def get_response_async(self, request):
        if request.path_info.startswith(settings.API_PATHS):
            return await self._api_async_handler.get_response_async(request)
        return await super().get_response_async(request)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)  # refuses it
            return
        try:
            if _declared_length(scope) > settings.MAX_REQUEST_BODY_BYTES:
                raise BodyRefused(errors.PayloadTooLarge())
            if _is_async_view(settings.ROOT_URLCONF, _path_info(scope)):
                await self.handle(scope, receive, send)
            else:
                await self._handle_sync(scope, receive, send)
        except BodyRefused as refused:
            from hordeops.api import error_response_for_path

            response = error_response_for_path(_path_info(scope), refused.error)
            # The rest of the body is not read: the connection cannot carry another request.
            # Lower-case, as uvicorn writes its own: it adds one unless it finds this exact header.
            response["connection"] = "close"
            await self.send_response(response, send)

    async def read_body(self, receive):
        """The body, refused as it arrives once it is over the limit or stalls (Django reads it all).

        Over `MAX_REQUEST_BODY_BYTES` is a 413 at the chunk that crosses it, so no more than
        that is ever held (in memory: the spool rolls over to disk only past Django's 2.5 MB).
        A body with no new bytes for `REQUEST_BODY_STALL_SECONDS`, or not complete within
        `REQUEST_BODY_SECONDS`, is a 408: a client cannot hold a connection by sending slowly.
        """
        body_file = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")
        loop = asyncio.get_running_loop()
        ends = loop.time() + settings.REQUEST_BODY_SECONDS
        size = 0
        try:
            while True:
                wait = max(0.0, min(settings.REQUEST_BODY_STALL_SECONDS, ends - loop.time()))
                try:
                    async with asyncio.timeout(wait):
                        message = await receive()
                except TimeoutError:
                    raise BodyRefused(errors.BodyTimeout()) from None
                if message["type"] == "http.disconnect":
                    raise RequestAborted()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > settings.MAX_REQUEST_BODY_BYTES:
                    raise BodyRefused(errors.PayloadTooLarge())
                body_file.write(chunk)
                if not message.get("more_body", False):
                    break
        except BaseException:
            body_file.close()
            raise
        body_file.seek(0)
        return body_file

    async def send_response(self, response, send):
        """Django's, with a stream ended when its requester stops reading (Django would wait).

        A send that the server cannot complete within STREAM_SEND_TIMEOUT_SECONDS (uvicorn
        waits while its transport's buffer is full), or a follower past STREAM_QUEUE_MAX_BYTES
        (StreamStalled from the stream, or its `Stall` waking a blocked send), ends the stream
        as a disconnect does: its iterator is closed, and `Exchange._follow` cancels the
        request. The connection is aborted: closing it would wait for the peer to read first.
        """
        if not response.streaming:
            await super().send_response(response, send)
            return
        timeout = settings.STREAM_SEND_TIMEOUT_SECONDS
        stall = getattr(response, "stall", None) or streams.Stall()
        stall.task = asyncio.current_task()

        async def send_within(message) -> None:
            stall.sending = True
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                logger.warning("a stream's requester took none of it for %s s; the stream ends", timeout)
                raise errors.StreamStalled() from None
            except asyncio.CancelledError:
                if not stall.stalled:
                    raise  # the requester left, or the server stops
                asyncio.current_task().uncancel()  # woken by its follower (Stall.stall)
                raise errors.StreamStalled() from None
            finally:
                stall.sending = False

        try:
            await super().send_response(response, send_within)
        except errors.StreamStalled:
            _abort_connection(send)
            # Its generators hold each other (the view's exchange), so nothing closes them
            # until a full garbage collection: closed now, the request is cancelled now.
            stream = getattr(response, "_iterator", None)
            if hasattr(stream, "aclose"):
                await stream.aclose()

    async def _handle_sync(self, scope, receive, send) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        try:
            # Not in a copy of the event loop's context: each thread keeps its own, as a WSGI
            # thread does, so what Django keeps per context (the cache clients, and through
            # them the Redis client) is made once per thread, not once per request.
            response = await loop.run_in_executor(self._sync_threads, self._sync_response, scope, body_file)
            finish = getattr(response, "finish_on_loop", None)
            if finish is not None and not await finish(receive):
                return  # the client left while its answer waited (a waiting pop)
            try:
                await self.send_response(response, send)
            finally:
                if response.streaming:  # closed once its iterator is spent
                    await loop.run_in_executor(self._sync_threads, response.close)
        finally:
            body_file.close()

    def _sync_response(self, scope, body_file) -> HttpResponseBase:
        """One request, as Django's WSGIHandler serves it, up to the bytes to send."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            api = request.path_info.startswith(settings.API_PATHS)
            response = (self._api_handler if api else self._page_handler).get_response(request)
            response._handler_class = self.__class__
        if not response.streaming:
            # The content is bytes already; closing now sends request_finished, which
            # gives the connection back before the answer is written out.
            response.close()
        return response


def _sync_handler(middleware: list[str]) -> BaseHandler:
    """Django's sync handler with `middleware` for its chain. Django reads the chain from the
    setting while it loads it, at start-up; the setting is given back at once."""
    handler, configured = BaseHandler(), settings.MIDDLEWARE
    settings.MIDDLEWARE = middleware
    try:
        handler.load_middleware(is_async=False)
    finally:
        settings.MIDDLEWARE = configured
    return handler


# The API's middleware steps that do no I/O (counters, headers, the request's own fields), by
# middleware: in an async route's chain they run on the event loop, where Django's
# `MiddlewareMixin` hops to a thread for each. The rate limits' request step reads Redis and
# keeps its hop.
ON_THE_LOOP: dict[str, frozenset[str]] = {
    "django_prometheus.middleware.PrometheusBeforeMiddleware": frozenset(
        {"process_request", "process_response"}
    ),
    "hordeops.api.BodyLimitMiddleware": frozenset({"process_request"}),
    "hordeops.api.RateLimitMiddleware": frozenset({"process_response"}),
    "django.middleware.security.SecurityMiddleware": frozenset({"process_request", "process_response"}),
    "django.middleware.common.CommonMiddleware": frozenset({"process_request", "process_response"}),
    "django.middleware.clickjacking.XFrameOptionsMiddleware": frozenset({"process_response"}),
    "django_prometheus.middleware.PrometheusAfterMiddleware": frozenset(
        {
            "process_request",
            "process_view",
            "process_response",
            "process_exception",
            "process_template_response",
        }
    ),
}


class _OnTheLoop(MiddlewareMixin):
    """`MiddlewareMixin.__acall__`, with the steps `ON_THE_LOOP` names (`loop_steps`, set on
    each wrapped class as it is made) called in place."""

    loop_steps: frozenset[str] = frozenset()

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            response = await _step(self.process_request, "process_request" in self.loop_steps)(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            on_the_loop = "process_response" in self.loop_steps
            response = await _step(self.process_response, on_the_loop)(request, response)
        return response


def _step(method, on_the_loop: bool):
    if not on_the_loop:
        return sync_to_async(method, thread_sensitive=True)

    async def in_place(*args):
        return method(*args)

    return in_place


class _LoopHandler(BaseHandler):
    def adapt_method_mode(self, is_async, method, method_is_async=None, debug=False, name=None):
        # A middleware's view, exception and template steps, adapted once at load.
        if is_async and method.__name__ in getattr(getattr(method, "__self__", None), "loop_steps", ()):
            return _step(method, True)
        return super().adapt_method_mode(is_async, method, method_is_async, debug, name)


def _loop_handler(middleware: list[str]) -> BaseHandler:
    """Django's async handler with `middleware` for its chain, each `MiddlewareMixin` in it
    taking `_OnTheLoop`'s steps. Django imports each middleware while it loads the chain, at
    start-up: the class it gets is wrapped there, and the import given back at once."""
    handler, configured, importing = _LoopHandler(), settings.MIDDLEWARE, base.import_string

    def on_the_loop(path: str):
        middleware = importing(path)
        if path not in ON_THE_LOOP or not issubclass(middleware, MiddlewareMixin):
            return middleware
        namespace = {"__module__": middleware.__module__, "loop_steps": ON_THE_LOOP[path]}
        return type(middleware.__name__, (_OnTheLoop, middleware), namespace)

    settings.MIDDLEWARE, base.import_string = middleware, on_the_loop
    try:
        handler.load_middleware(is_async=True)
    finally:
        settings.MIDDLEWARE, base.import_string = configured, importing
    return handler


def _abort_connection(send) -> None:
    """Reset the connection at once (uvicorn's `send` is its request cycle's, which holds the
    transport); under another server the stream just ends and the server closes it."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # A zero linger makes the close a reset: uvloop's abort() is a plain close, which
        # leaves the kernel holding the unread bytes while the peer's window stays shut.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class BodyRefused(Exception):
    """A body refused while it was being read; `error` is the answer."""

    def __init__(self, error: errors.DomainError) -> None:
        super().__init__(error.code)
        self.error = error


def _declared_length(scope) -> int:
    """The Content-Length the client announced, 0 when none or not a number (the middleware's 400)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() and len(value) <= 18 else 0
    return 0


def _path_info(scope) -> str:
    """The path the URLconf sees: the request path without the ASGI root path."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


@functools.lru_cache(maxsize=1024)
def _is_async_view(urlconf: str, path: str) -> bool:
    """Whether the view at `path` is async; remembered, as resolving costs more than a pop's SQL."""
    try:
        return iscoroutinefunction(get_resolver(urlconf).resolve(path).func)
    except Resolver404:
        return False  # the 404 handler is sync


# The admin's few assets (CSS, its scripts, the lease countdown) are served by Django's own
# static handler under /static/, so that the stack needs nothing in front of it; a public
# deployment puts `collectstatic` output behind its reverse proxy instead. The API and chat
# routes never pass through it.
class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's static handler, with a path that escapes its root a 404 (Django's is a 500)."""

    def serve(self, request):
        try:
            return super().serve(request)
        except (SuspiciousFileOperation, ValueError):  # ValueError: a NUL byte in the path
            raise Http404("Not found.") from None


django_application = StaticFilesHandler(HordeASGIHandler())


async def application(scope, receive, send):
    """Django, with the monotonic arrival time stamped before the body is read.

    Generation deadlines count body reads and everything after them.
    """
    if scope["type"] == "http":
        scope = clock.arrived_scope(scope)
    await django_application(scope, receive, send)
