"""Signing in with a provider (GitHub, Discord, Google, any OpenID Connect one) through
django-allauth, each on when its client id and secret are set (`hordeops/settings_sign_in.py`).

allauth does the provider's part and signs a Django user in, one per identity, with no password.
Its sign-in ends at `signed_in`, which turns that user into the horde account it holds
(`workers.identities`) and into the account page's own session (`front.account.start_session`),
leaving no Django login behind: a provider's identity never reaches the admin.

The first sign-in makes the account and shows its key once. Signing in again from the account
page just signs in; signing up again from `/register` is the AI Horde's "re-register": the
same account, a new key, shown once, the old one refused at once.
"""

import unicodedata
from dataclasses import dataclass

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib import auth
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from front import account, signup
from hordeops import errors
from hordeops.ratelimit import request_address
from workers import identities, services

PROVIDER_NAMES = {"github": "GitHub", "discord": "Discord", "google": "Google"}
REGISTER = "register"  # `then` of a sign-up's button: re-register an identity seen before


@dataclass(frozen=True)
class WayIn:
    provider: str
    name: str
    url: str
    next: str


def ways_in(*, then: str) -> list[WayIn]:
    """A button's worth for each provider turned on, in the settings' order."""
    landing = reverse("front:oauth-signed-in") + "?" + urlencode({"then": then})
    ways = []
    for provider, config in settings.SOCIALACCOUNT_PROVIDERS.items():
        if provider == "openid_connect":
            app = config["APPS"][0]
            url = reverse("openid_connect_login", kwargs={"provider_id": app["provider_id"]})
            ways.append(WayIn(app["provider_id"], app["name"], url, landing))
        else:
            ways.append(WayIn(provider, PROVIDER_NAMES[provider], reverse(f"{provider}_login"), landing))
    return ways


class NoLocalAccounts(DefaultAccountAdapter):
    """allauth's own accounts (a password, an email) are not this horde's: only a provider's
    identity signs in through allauth, and it always ends at `signed_in`."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False

    def get_login_redirect_url(self, request: HttpRequest) -> str:
        return reverse("front:oauth-signed-in")

    def add_message(self, *args, **kwargs) -> None:
        # No "Successfully signed in as <user>": that Django user is allauth's, not the account.
        pass


class IdentityAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest, sociallogin) -> bool:
        return True  # a provider's identity may sign up, in raid mode too

    def pre_social_login(self, request: HttpRequest, sociallogin) -> None:
        # Before allauth makes or signs in a user: a timed-out address gets the sign-up page's refusal.
        try:
            services.refuse_sign_up(address=request_address(request), pseudonymous=False)
        except errors.DomainError as refused:
            raise ImmediateHttpResponse(signup.refusal(request, refused)) from None
        # The horde keeps no email: none is stored, and two identities with one address are two
        # accounts, as the AI Horde's are (one per OAuth id), never a form asking for another.
        sociallogin.email_addresses = []
        sociallogin.user.email = ""


def display_name(identity: SocialAccount) -> str:
    """The name a new account takes from its identity, by the sign-up form's rules."""
    data = identity.get_provider_account().get_user_data() or {}
    raw = next(
        (
            str(data[field])
            for field in ("preferred_username", "login", "global_name", "username", "name")
            if data.get(field)
        ),
        "",
    )
    name = "".join(char for char in raw if unicodedata.category(char) not in signup.UNPRINTABLE).strip()
    return name[: signup.NAME_MAX_CHARS] or "user"


@never_cache
@require_http_methods(["GET"])  # not HEAD: a key made for an answer with no body would be lost
def signed_in(request: HttpRequest) -> HttpResponse:
    """Where allauth's sign-in ends: the account of the identity, signed in on the account page."""
    user = request.user
    identity = SocialAccount.objects.filter(user_id=user.pk).first() if user.is_authenticated else None
    if identity is None:
        # Not a provider's sign-in (a reload of this page, a moderator's admin login): nothing to do.
        return HttpResponseRedirect(reverse("front:account"))
    auth.logout(request)
    try:
        signed = identities.account_for_identity(
            user_id=user.pk, name=display_name(identity), reregister=request.GET.get("then") == REGISTER
        )
    except errors.DomainError as refused:
        context = {"title": "Sign in", "form": account.SignInForm(), "refused": refused.message}
        return TemplateResponse(request, "front/account_sign_in.html", context, status=refused.status)
    account.start_session(request, signed.account)
    if signed.api_key:
        return account.render_page(request, signed.account, new_key=signed.api_key, first_key=signed.made)
    return HttpResponseRedirect(reverse("front:account"))
