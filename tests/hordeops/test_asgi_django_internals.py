"""hordeops/asgi.py leans on Django internals: this fails loudly when an upgrade changes them.

Checked against Django 5.2 (the pinned 5.2.19). On a failure here, read the new Django's
`django/core/handlers/asgi.py` and `base.py` and `contrib/staticfiles/handlers.py`, adapt
`hordeops/asgi.py`, and update the expectations below.
"""

import inspect

import django
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler, StaticFilesHandlerMixin
from django.core.handlers import asgi as django_asgi
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpResponseBase, StreamingHttpResponse


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_django_version_is_one_hordeops_asgi_was_checked_against():
    assert django.VERSION[:2] == (5, 2), django.get_version()


def test_the_asgi_handler_methods_hordeops_calls_or_overrides_keep_their_signatures():
    assert _parameters(ASGIHandler.read_body) == ["self", "receive"]
    assert _parameters(ASGIHandler.create_request) == ["self", "scope", "body_file"]
    assert _parameters(ASGIHandler.send_response) == ["self", "response", "send"]
    assert _parameters(ASGIHandler.handle) == ["self", "scope", "receive", "send"]
    assert _parameters(BaseHandler.load_middleware) == ["self", "is_async"]
    assert _parameters(BaseHandler.get_response) == ["self", "request"]
    assert _parameters(django_asgi.get_script_prefix) == ["scope"]


def test_handle_reads_the_body_first_so_a_refused_body_answers_before_any_request_work():
    source = inspect.getsource(ASGIHandler.handle)
    assert source.index("await self.read_body(receive)") < source.index("create_request")
    assert "except RequestAborted" in source


def test_responses_still_carry_the_handler_class_that_closing_them_reads():
    source = inspect.getsource(HttpResponseBase.close)
    assert "_handler_class" in source and "request_finished" in source


def test_the_static_handler_still_serves_through_serve_and_turns_http404_into_a_response():
    assert _parameters(ASGIStaticFilesHandler.serve) == ["self", "request"]
    source = inspect.getsource(StaticFilesHandlerMixin.get_response_async)
    assert "self.serve" in source and "except Http404" in source


def test_a_streaming_response_keeps_its_async_generator_where_a_stalled_stream_closes_it():
    # HordeASGIHandler.send_response closes `_iterator` at once: the view's generators hold each
    # other, so only a full garbage collection would close them (and cancel the request) otherwise.
    async def stream():
        yield b""

    content = stream()
    assert StreamingHttpResponse(content)._iterator is content


def test_the_async_chain_imports_each_middleware_and_adapts_its_steps_where_the_loop_chain_hooks_in():
    # hordeops.asgi._loop_handler wraps the classes `import_string` gives `load_middleware`,
    # and `_LoopHandler` overrides `adapt_method_mode` for the view and exception steps.
    from django.core.handlers import base
    from django.utils.deprecation import MiddlewareMixin

    assert "import_string(middleware_path)" in inspect.getsource(BaseHandler.load_middleware)
    assert base.import_string.__module__ == "django.utils.module_loading"
    assert _parameters(BaseHandler.adapt_method_mode) == [
        "self", "is_async", "method", "method_is_async", "debug", "name"
    ]  # fmt: skip
    assert "self.__acall__(request)" in inspect.getsource(MiddlewareMixin.__call__)
