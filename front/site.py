import functools
import logging

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path

from hordeops import clock, logins, replica
from jobs import operations

logger = logging.getLogger(__name__)


def _lists_read_the_replica(view):
    @functools.wraps(view)
    def changelist(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            return view(request, *args, **kwargs)
        return replica.run(view, request, *args, **kwargs)

    return changelist


class HordeAdminSite(admin.AdminSite):
    # No "View site": hordeops has no site beside its API and this admin.
    site_url = None
    site_header = "hordeops moderation"
    site_title = "hordeops"
    index_title = "Moderation and operations"
    index_template = "admin/front/index.html"

    def login(self, request: HttpRequest, extra_context=None):
        """Django's admin login, refused (429, the form and why) past the failed-login bounds,
        before the password is checked (`hordeops.logins`)."""
        if request.method == "POST":
            locked = logins.lockout(request=request, username=request.POST.get("username", ""))
            if locked is not None:
                logger.warning("admin login refused: %s locked for %d s", locked.what, locked.seconds)
                context = {
                    **self.each_context(request),
                    "title": "Log in",
                    "form": AdminAuthenticationForm(request),
                    "login_refused": f"Too many failed logins {locked.reason}: {locked.wait}.",
                    **(extra_context or {}),
                }
                return TemplateResponse(request, "admin/login.html", context, status=429)
        return super().login(request, extra_context)

    def admin_view(self, view, cacheable=False):
        # The lists read from the replica, when there is one (hordeops.replica); their actions
        # (a POST) and every other page read the primary.
        if getattr(view, "__name__", "") == "changelist_view":
            view = _lists_read_the_replica(view)
        return super().admin_view(view, cacheable)

    def get_urls(self):
        return [
            path("operations/", self.admin_view(self.operations_view), name="operations"),
            *super().get_urls(),
        ]

    def operations_view(self, request: HttpRequest) -> TemplateResponse:
        # Whoever may view generations (moderators, superusers) may see the whole horde's state.
        if not request.user.has_perm("jobs.view_generation"):
            raise PermissionDenied
        snapshot = operations.snapshot(now=clock.now())
        context = {
            **self.each_context(request),
            "title": "Operations",
            "operations": snapshot,
            "breakdown": [
                ("by account", snapshot.by_account),
                ("by model", snapshot.by_model),
                ("by age", snapshot.by_age),
            ],
            "chart_width": operations.CHART_WIDTH,
            "chart_height": operations.CHART_HEIGHT,
        }
        return TemplateResponse(request, "admin/front/operations.html", context)
