from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path

from hordeops import clock
from jobs import operations


class HordeAdminSite(admin.AdminSite):
    site_header = "hordeops moderation"
    site_title = "hordeops"
    index_title = "Moderation and operations"
    index_template = "admin/hordeops/index.html"

    def get_urls(self):
        return [
            path("operations/", self.admin_view(self.operations_view), name="operations"),
            *super().get_urls(),
        ]

    def operations_view(self, request: HttpRequest) -> TemplateResponse:
        # Whoever may view generations (moderators, superusers) may see the whole horde's state.
        if not request.user.has_perm("jobs.view_generation"):
            raise PermissionDenied
        context = {
            **self.each_context(request),
            "title": "Operations",
            "operations": operations.snapshot(now=clock.now()),
            "chart_width": operations.CHART_WIDTH,
            "chart_height": operations.CHART_HEIGHT,
        }
        return TemplateResponse(request, "admin/hordeops/operations.html", context)
