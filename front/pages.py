"""The page a stranger lands on: what this horde is and what is online now."""

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse


def home(request: HttpRequest) -> HttpResponse:
    return TemplateResponse(request, "front/home.html", {"title": "hordeops"})
