"""Signing in with a provider (`front/oauth.py`): where allauth's sign-in ends, each case the
issue names. allauth's part (the provider's redirects, the code, the ID token) runs for real in
tests/front/test_oauth_in_a_browser.py; here a Django user holding an identity stands for it
having run, and the pages and rules around it are checked one at a time."""

import re
from datetime import timedelta

import pytest
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client, RequestFactory

from front.oauth import IdentityAdapter, display_name
from front.signup import TIMED_OUT
from hordeops import clock
from workers import services
from workers.models import Account, HordeModes

pytestmark = pytest.mark.django_db

PROVIDERS = {
    "github": {"APPS": [{"client_id": "gh-id", "secret": "gh-secret"}], "SCOPE": []},
    "openid_connect": {
        "APPS": [
            {
                "provider_id": "oidc",
                "name": "Test ID",
                "client_id": "oidc-id",
                "secret": "oidc-secret",
                "settings": {"server_url": "http://127.0.0.1:9/openid"},
            }
        ],
        "SCOPE": ["openid", "profile"],
    },
}
KEY = re.compile(rb'data-testid="api-key">([^<]+)<')


@pytest.fixture(autouse=True)
def _providers(settings):
    settings.SOCIALACCOUNT_PROVIDERS = PROVIDERS


def _identity(username: str = "ada", uid: str = "1815") -> User:
    """What allauth leaves when a provider confirmed who someone is: a Django user with no
    password, holding the identity, signed in."""
    user = User.objects.create_user(f"{username}-{uid}")
    SocialAccount.objects.create(
        user=user, provider="oidc", uid=uid, extra_data={"userinfo": {"preferred_username": username}}
    )
    return user


def _signed_in(client: Client, user: User, then: str = "sign-in"):
    client.force_login(user)
    return client.get(f"/account/oauth?then={then}")


def _shown_key(answer) -> str:
    found = KEY.search(answer.content)
    return found.group(1).decode().strip() if found else ""


def _find_user(client: Client, api_key: str):
    return client.get("/api/v2/find_user", HTTP_APIKEY=api_key)


def test_the_sign_in_pages_offer_each_provider_the_operator_turned_on(client):
    page = client.get("/account").content.decode()
    assert 'action="/oauth/github/login/"' in page and 'action="/oauth/oidc/login/"' in page
    assert "Sign in with GitHub" in page and "Sign in with Test ID" in page
    assert 'value="/account/oauth?then=sign-in"' in page
    register = client.get("/register").content.decode()
    assert "Sign up with GitHub" in register and 'value="/account/oauth?then=register"' in register


def test_no_provider_is_offered_when_none_is_turned_on(client, settings):
    settings.SOCIALACCOUNT_PROVIDERS = {}
    assert b"data-provider" not in client.get("/account").content
    assert b"data-provider" not in client.get("/register").content


def test_a_first_sign_in_makes_an_account_and_shows_its_key_once(client):
    user = _identity()
    answer = _signed_in(client, user)
    api_key = _shown_key(answer)
    account = Account.objects.get(user=user)
    assert answer.status_code == 200 and api_key
    assert f"ada#{account.pk}".encode() in answer.content
    assert not account.pseudonymous
    assert _find_user(client, api_key).json()["username"] == f"ada#{account.pk}"
    # The account page's own session holds it; allauth's Django login is gone.
    assert "_auth_user_id" not in client.session
    again = client.get("/account")
    assert f"ada#{account.pk}".encode() in again.content and not _shown_key(again)
    # The sign-in's end reloaded: nothing to do, no key.
    reload = client.get("/account/oauth?then=register")
    assert reload.status_code == 302 and reload["location"] == "/account"


def test_signing_up_again_gives_the_same_account_a_new_key_and_refuses_the_old(client):
    user = _identity()
    first = _shown_key(_signed_in(client, user))
    second = _shown_key(_signed_in(client, user, then="register"))
    assert second and second != first
    assert _find_user(client, first).status_code == 401
    assert _find_user(client, second).status_code == 200
    assert Account.objects.filter(user=user).count() == 1


def test_signing_in_again_from_the_account_page_keeps_the_key(client):
    user = _identity()
    api_key = _shown_key(_signed_in(client, user))
    again = _signed_in(client, user)
    assert again.status_code == 302 and again["location"] == "/account"
    assert _find_user(client, api_key).status_code == 200
    assert b"ada#" in client.get("/account").content


def test_two_identities_are_two_accounts(client):
    ada, grace = _identity("ada", "1"), _identity("grace", "2")
    _signed_in(client, ada)
    _signed_in(Client(), grace)
    assert Account.objects.get(user=ada).pk != Account.objects.get(user=grace).pk


def test_a_suspended_accounts_identity_is_refused_and_keeps_its_key(client):
    user = _identity()
    api_key = _shown_key(_signed_in(client, user))
    Account.objects.filter(user=user).update(suspended_at=clock.now(), suspension_reason="spam")
    answer = _signed_in(Client(), user, then="register")
    assert answer.status_code == 403 and b"spam" in answer.content and not _shown_key(answer)
    Account.objects.filter(user=user).update(suspended_at=None)
    assert _find_user(client, api_key).status_code == 200


def test_a_moderators_admin_login_is_not_a_providers_sign_in(moderator):
    answer = moderator.get("/account/oauth?then=register")
    assert answer.status_code == 302 and answer["location"] == "/account"
    assert moderator.get("/admin/").status_code == 200  # still logged in to the admin
    assert not Account.objects.filter(user__isnull=False).exists()


def test_a_timed_out_address_cannot_sign_in_with_a_provider():
    now = clock.now()
    services.time_out_address(network="203.0.113.9", until=now + timedelta(hours=1), by="mod", now=now)
    request = RequestFactory().get("/oauth/oidc/login/callback/", REMOTE_ADDR="203.0.113.9")
    with pytest.raises(ImmediateHttpResponse) as refused:
        IdentityAdapter().pre_social_login(request, sociallogin=None)
    answer = refused.value.response.render()
    assert answer.status_code == 403 and TIMED_OUT.encode() in answer.content


def test_raid_mode_closes_the_pseudonymous_sign_up_but_offers_the_providers(client):
    HordeModes.objects.update_or_create(pk=1, defaults={"raid": True})
    answer = client.get("/register")
    assert answer.status_code == 403
    assert b"We cannot allow anonymous registrations" in answer.content
    assert b"Sign up with GitHub" in answer.content
    # A provider's identity still makes its account.
    assert _shown_key(_signed_in(client, _identity()))


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("ada", "ada"),
        ("a\x00d\u202ea", "ada"),
        ("x" * 40, "x" * 30),
        ("\x07\x07", "user"),
    ],
)
def test_a_name_from_a_provider_keeps_to_the_sign_up_forms_rules(given, name):
    identity = SocialAccount(provider="oidc", uid="1", extra_data={"userinfo": {"preferred_username": given}})
    assert display_name(identity) == name


def test_a_head_request_to_the_sign_ins_end_makes_nothing(client):
    user = _identity()
    client.force_login(user)
    assert client.head("/account/oauth?then=register").status_code == 405
    assert not Account.objects.filter(user=user).exists()
