"""A stranger joins the horde in a real headless Chromium: from `/` to `/register`, where the
page solves its proof of work, to a key that works on the API.

Screenshots go to $SCREENSHOT_DIR as the admin's browser tests write theirs (README, docs)."""

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.front.test_admin_in_a_browser import chromium, screenshot
from tests.live import LiveStack
from workers.models import Account

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)


def test_a_stranger_signs_up_from_the_home_page_and_the_key_works(live_stack: LiveStack):
    base_url = live_stack.urls[0]
    with chromium() as page:
        page.goto(f"{base_url}/")
        expect(page.locator("h1")).to_have_text("hordeops")
        screenshot(page, "home")
        page.get_by_role("link", name="Sign up").first.click()
        expect(page).to_have_url(re.compile(r"/register$"))
        page.get_by_label("Display Name").fill("Stranger")
        # The page's script solves the challenge (about a second; longer on a busy machine).
        expect(page.get_by_role("button", name="Submit")).to_be_enabled(timeout=60_000)
        expect(page.locator("#proof-of-work-status")).to_contain_text("Puzzle solved")
        screenshot(page, "register")
        page.get_by_role("button", name="Submit").click()
        api_key = page.locator("[data-testid=api-key]").inner_text().strip()
        expect(page.get_by_role("link", name="your account page")).to_have_attribute("href", "/account")
        screenshot(page, "registered")

    found = httpx.get(f"{base_url}/api/v2/find_user", headers={"apikey": api_key}, timeout=10)
    assert found.status_code == 200, found.text
    account = Account.objects.get(name="Stranger")
    assert found.json()["username"] == f"Stranger#{account.pk}"
    assert account.pseudonymous
