"""allauth's routes under /oauth/: each provider's (`github/login/` and its callback, ...) and its
pages for a cancelled or failed sign-in; none of its own accounts' (passwords, emails), which are
not this horde's (front/oauth.py). Outside the `front` namespace: allauth finds them by name."""

from allauth.socialaccount import views
from allauth.urls import build_provider_urlpatterns
from django.urls import include, path

urlpatterns = [
    path("login/cancelled/", views.login_cancelled, name="socialaccount_login_cancelled"),
    path("login/error/", views.login_error, name="socialaccount_login_error"),
    path("", include(build_provider_urlpatterns())),
]
