"""The page a stranger lands on: what this horde is and what is online now."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from hordeops import clock
from jobs import discovery
from workers import modes


def home(request: HttpRequest) -> HttpResponse:
    # The discovery routes' own reads, cached for seconds: a stranger's visit costs no more.
    now = clock.now()
    context = {
        "title": "hordeops",
        "load": discovery.performance(now=now),
        "models": discovery.models_status(now=now, kind=discovery.TEXT, min_count=None, max_count=None),
        "modes": modes.current(),
        "docs_url": settings.DOCS_URL,
    }
    return TemplateResponse(request, "front/home.html", context)
