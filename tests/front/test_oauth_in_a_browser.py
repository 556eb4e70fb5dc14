"""Signing in with a provider in a real headless Chromium, through a real OpenID Connect provider
process (tests/oidc_provider, `oidc_provider`): the first sign-in makes the account and shows its
key; signing up again from /register gives the same account a new key and the old one is refused
at once; signing in again from the account page changes nothing.
"""

import re

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.front.test_admin_in_a_browser import chromium, screenshot
from tests.identity_provider import PASSWORD, USERNAME, IdentityProvider
from tests.live import LiveStack
from workers.models import Account

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)


def _through_the_provider(page: Page, button: str, *, asked_who: bool = False) -> None:
    page.get_by_role("button", name=button).click()
    if asked_who:
        # The provider asks who this is once; later its own session answers for the person.
        expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
        page.get_by_label("Username").fill(USERNAME)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()


def _find_user(base: str, api_key: str) -> httpx.Response:
    return httpx.get(f"{base}/api/v2/find_user", headers={"apikey": api_key})


def test_a_provider_sign_in_makes_an_account_and_signing_up_again_resets_its_key(
    oidc_provider: IdentityProvider, live_stack: LiveStack
):
    base = live_stack.urls[0]
    oidc_provider.allow_redirect(f"{base}/oauth/oidc/login/callback/")

    with chromium() as page:
        page.goto(f"{base}/account")
        screenshot(page, "account-sign-in")
        _through_the_provider(page, "Sign in with Test ID", asked_who=True)
        expect(page.get_by_test_id("api-key")).to_be_visible()
        first_key = page.get_by_test_id("api-key").inner_text().strip()
        expect(page.get_by_role("heading", name=re.compile(rf"^{USERNAME}#\d+$"))).to_be_visible()
        page.get_by_role("button", name="Sign out").click()

        page.goto(f"{base}/register")
        _through_the_provider(page, "Sign up with Test ID")
        expect(page.get_by_test_id("api-key")).to_be_visible()
        second_key = page.get_by_test_id("api-key").inner_text().strip()
        page.get_by_role("button", name="Sign out").click()

        page.goto(f"{base}/account")
        _through_the_provider(page, "Sign in with Test ID")
        expect(page.get_by_role("heading", name=re.compile(rf"^{USERNAME}#\d+$"))).to_be_visible()
        expect(page.get_by_test_id("api-key")).to_have_count(0)
        # A reload of the sign-in's end shows no key and changes nothing.
        page.goto(f"{base}/account/oauth?then=register")
        expect(page).to_have_url(f"{base}/account")
        expect(page.get_by_test_id("api-key")).to_have_count(0)

    assert first_key and second_key and first_key != second_key
    refused = _find_user(base, first_key)
    assert refused.status_code == 401 and refused.json()["rc"] == "InvalidAPIKey"
    found = _find_user(base, second_key)
    assert found.status_code == 200
    account = Account.objects.get(user__socialaccount__provider="oidc")
    assert found.json()["username"] == f"{USERNAME}#{account.pk}"
    assert account.pseudonymous is False
    assert Account.objects.filter(user__isnull=False).count() == 1
    assert account.user.email == "" and not account.user.has_usable_password()
