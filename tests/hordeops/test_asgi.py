"""hordeops.asgi: a sync route runs as under WSGI, on a lasting thread, not hop by hop."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import SyncToAsync
from django.core import signals
from django.core.handlers.asgi import ASGIHandler

from hordeops import asgi
from hordeops.views import HeartbeatView


def _get(
    app, path: str, headers: list[tuple[bytes, bytes]] = (), sent: list[dict] | None = None
) -> tuple[int, bytes, int]:
    """Run one GET through an ASGI app; return the status, the body and the thread hops taken
    (the messages sent go to `sent`, when given)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    sent = [] if sent is None else sent
    received = 0

    async def receive():
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected; Django cancels this wait

    async def send(message):
        sent.append(message)

    hops = 0
    original = SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    SyncToAsync.__call__ = counting
    try:
        asyncio.run(app(scope, receive, send))
    finally:
        SyncToAsync.__call__ = original
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, hops


@pytest.mark.django_db(transaction=True)
def test_a_sync_route_runs_its_middleware_chain_without_a_hop_per_middleware():
    status, body, hops = _get(asgi.application, "/api/v2/status/heartbeat")
    _, _, django_hops = _get(ASGIHandler(), "/api/v2/status/heartbeat")
    assert status == 200 and json.loads(body)
    # Not one sync_to_async hop: the request's one trip to a sync thread is a plain
    # executor call. Django's own handler takes one or two per middleware, and more for
    # its request signals and the response's close (over 20 with this project's).
    assert hops == 0
    assert django_hops >= 15


@pytest.mark.django_db(transaction=True)
def test_sync_views_run_on_a_few_lasting_threads_not_one_new_thread_per_request(settings):
    seen: list[str] = []
    original = HeartbeatView.get

    def recording(self, request):
        seen.append(threading.current_thread().name)
        return original(self, request)

    HeartbeatView.get = recording
    try:
        for _ in range(12):
            assert _get(asgi.application, "/api/v2/status/heartbeat")[0] == 200
    finally:
        HeartbeatView.get = original
    assert len(seen) == 12
    assert all(name.startswith("hordeops-sync") for name in seen)
    assert len(set(seen)) <= settings.WEB_SYNC_THREADS


@pytest.mark.django_db(transaction=True)
def test_an_async_route_still_answers_through_the_async_chain():
    status, body, _ = _get(asgi.application, "/v1/chat/completions")
    assert status == 405
    assert b"error" in body


@pytest.mark.django_db(transaction=True)
def test_an_async_api_route_hops_to_a_thread_only_for_the_steps_that_do_io():
    sent: list[dict] = []
    status, _, hops = _get(asgi.application, "/v1/chat/completions", sent=sent)
    _, _, django_hops = _get(ASGIHandler(), "/v1/chat/completions")
    assert status == 405
    # The request signals, the rate limits' Redis read, the error's log line and the
    # response's close; Django's chain takes one or two more per middleware.
    assert hops <= 4, hops
    assert django_hops >= hops + 12, django_hops
    # The steps run on the loop still ran: the security and framing headers are there.
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {name.lower(): value for name, value in start["headers"]}
    assert headers[b"x-frame-options"] == b"DENY"
    assert headers[b"x-content-type-options"] == b"nosniff"


def test_loading_the_loop_chain_leaves_the_settings_and_djangos_import_as_they_were():
    asgi._loop_handler(["hordeops.api.RateLimitMiddleware", "django.middleware.common.CommonMiddleware"])
    from django.conf import settings
    from django.core.handlers import base

    assert "hordeops.api.RateLimitMiddleware" in settings.MIDDLEWARE
    assert len(settings.MIDDLEWARE) > 2
    assert base.import_string.__module__ == "django.utils.module_loading"


@pytest.mark.django_db(transaction=True)
def test_an_unknown_path_gets_the_horde_404_through_the_sync_chain():
    status, body, _ = _get(asgi.application, "/api/v2/nothing-here")
    assert status == 404
    assert json.loads(body)["rc"]


def test_behind_a_root_path_a_chat_route_is_still_known_as_async():
    scope = {"path": "/horde/v1/chat/completions", "root_path": "/horde"}
    assert asgi._path_info(scope) == "/v1/chat/completions"
    assert asgi._is_async_view("hordeops.urls", asgi._path_info(scope))
    assert not asgi._is_async_view("hordeops.urls", "/api/v2/generate/text/pop")


@pytest.mark.django_db(transaction=True)
def test_request_signals_run_on_the_thread_that_serves_the_view():
    # close_old_connections listens to both: it must see the connection the view used.
    threads: dict[str, set[str]] = {"started": set(), "view": set(), "finished": set()}
    original = HeartbeatView.get

    def on_started(**kwargs):
        threads["started"].add(threading.current_thread().name)

    def on_finished(**kwargs):
        threads["finished"].add(threading.current_thread().name)

    def recording(self, request):
        threads["view"].add(threading.current_thread().name)
        return original(self, request)

    signals.request_started.connect(on_started)
    signals.request_finished.connect(on_finished)
    HeartbeatView.get = recording
    try:
        assert _get(asgi.application, "/api/v2/status/heartbeat")[0] == 200
    finally:
        HeartbeatView.get = original
        signals.request_started.disconnect(on_started)
        signals.request_finished.disconnect(on_finished)
    assert len(threads["view"]) == 1
    assert threads["started"] == threads["view"] == threads["finished"]
    assert next(iter(threads["view"])).startswith("hordeops-sync")


@pytest.mark.parametrize(
    "path",
    [
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/../../../etc/passwd",
        "/static/admin/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/%00",
        "/static/admin/css/no-such-file.css",
    ],
)
def test_a_static_path_outside_the_static_files_is_a_json_404(path):
    from urllib.parse import unquote

    status, body, _ = _get(asgi.application, unquote(path))
    assert status == 404
    assert json.loads(body) == {"message": "Not found.", "rc": "NotFound"}


def test_the_admins_own_static_files_are_still_served():
    status, body, _ = _get(asgi.application, "/static/admin/css/base.css")
    assert status == 200 and b"DJANGO Admin styles" in body


@pytest.mark.django_db(transaction=True)
def test_only_the_pages_pass_the_page_only_middleware(monkeypatch):
    from django.contrib.messages.middleware import MessageMiddleware
    from django.contrib.sessions.middleware import SessionMiddleware
    from django.middleware.csrf import CsrfViewMiddleware

    seen: list[str] = []
    for middleware in (SessionMiddleware, MessageMiddleware):
        original = middleware.process_request

        def recording(self, request, original=original):
            seen.append(f"{type(self).__name__} {request.path}")
            return original(self, request)

        monkeypatch.setattr(middleware, "process_request", recording)
    csrf_view = CsrfViewMiddleware.process_view

    def recording_view(self, request, *args):
        seen.append(f"CsrfViewMiddleware {request.path}")
        return csrf_view(self, request, *args)

    monkeypatch.setattr(CsrfViewMiddleware, "process_view", recording_view)
    assert _get(asgi.application, "/api/v2/status/heartbeat")[0] == 200
    assert _get(asgi.application, "/api/v2/no-such-route")[0] == 404
    assert seen == []
    status, body, _ = _get(asgi.application, "/admin/login/")
    assert status == 200 and b"csrfmiddlewaretoken" in body  # the login form, as before
    assert seen == [
        "SessionMiddleware /admin/login/",
        "MessageMiddleware /admin/login/",
        "CsrfViewMiddleware /admin/login/",
    ]
    seen.clear()
    assert _get(asgi.application, "/")[0] == 200  # people's pages sign in with a session too
    assert seen == ["SessionMiddleware /", "MessageMiddleware /"]
