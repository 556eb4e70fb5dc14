"""A small OpenID Connect provider for the OAuth sign-in's tests (tests/front/test_oauth_in_a_browser.py):
a second Django project, on django-oidc-provider, that the test starts as its own process with
its own SQLite file. It is the identity provider a horde's operator would configure, not part of
the horde: nothing of hordeops imports it.
"""

import os

BASE = os.path.dirname(__file__)
SECRET_KEY = "a test identity provider's key, not a secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.oidc_provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oidc_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [os.path.join(BASE, "templates")],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OIDC_PROVIDER_DB"]}}
USE_TZ = True
LOGIN_URL = "/login/"
# The horde signs in on another port of the same host: a cookie per port is not a thing, so the
# provider's session cookie must not share the horde's name.
SESSION_COOKIE_NAME = "idp_session"
CSRF_COOKIE_NAME = "idp_csrftoken"
OIDC_USERINFO = "tests.oidc_provider.claims.userinfo"
OIDC_IDTOKEN_INCLUDE_CLAIMS = True
