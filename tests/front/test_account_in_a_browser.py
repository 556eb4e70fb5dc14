"""The account page in a real headless Chromium, as a person uses it: sign in with the key,
see the balance and the chart, make a shared key and see it listed, reset the key and read the
new one; the old key is then refused, the shared key still spends for the account.

Rows are made before `chromium()` opens (Playwright's loop runs in this thread, and Django
refuses ORM calls beside it). Screenshots go to $SCREENSHOT_DIR, as the admin's do.
"""

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import Generation, TextRequest
from kudos import ledger
from kudos.models import Event, Wallet
from tests.front.test_admin_in_a_browser import chromium, screenshot
from tests.live import LiveStack
from workers.models import SharedKey, Worker
from workers.services import create_account

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)


def _history(account_id: int) -> None:
    """A few weeks of kudos, so that the chart has bars to show."""
    now = timezone.now()
    for days_ago, amount in ((20, "400"), (12, "250"), (5, "900"), (1, "120"), (0, "60")):
        ledger.post(
            kind=Event.Kind.AWARD,
            key=f"award:{account_id}:{uuid.uuid4()}",
            entries=[
                ledger.to_system(Wallet.System.TREASURY, -Decimal(amount)),
                ledger.to_account(account_id, Decimal(amount)),
            ],
            reason="for testing the account page",
            now=now - timedelta(days=days_ago),
        )


def _tokens(account, worker: Worker) -> None:
    """Generations the account asked for and its worker served, over the same weeks."""
    now = timezone.now()
    for days_ago, tokens in ((18, 900), (9, 2400), (4, 1500), (0, 700)):
        at = now - timedelta(days=days_ago)
        request = TextRequest.objects.create(
            account=account,
            prompt="hello",
            created_at=at,
            expires_at=at,
            state=TextRequest.State.DONE,
            queued=0,
            finished=1,
        )
        Generation.objects.create(
            request=request,
            worker=worker,
            state=Generation.State.DONE,
            job_ttl=60,
            cap_seconds=60,
            popped_at=at,
            finished_at=at,
            text="…",
            tokens=tokens,
        )


def test_a_person_signs_in_sees_their_kudos_makes_a_shared_key_and_resets_their_key(live_stack: LiveStack):
    account, api_key = create_account(name="alice")
    _history(account.pk)
    worker = Worker.objects.create(name="alice-gpu", account=account, speed=21.3, completed_jobs=128)
    _tokens(account, worker)
    base = live_stack.urls[0]

    with chromium() as page:
        page.goto(f"{base}/account")
        page.locator("input[name=apikey]").fill(api_key)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name=f"alice#{account.pk}")).to_be_visible()
        expect(page.get_by_test_id("balance")).to_have_text("1,730.00")
        chart = page.get_by_test_id("kudos-chart").locator("svg.chart")
        expect(chart).to_be_visible()
        assert chart.locator("rect.earned[height]").count() == 30
        assert float(chart.locator("rect.earned").nth(29 - 5).get_attribute("height")) > 0
        tokens = page.get_by_test_id("tokens-chart").locator("svg.chart")
        assert float(tokens.locator("rect.served").nth(29 - 9).get_attribute("height")) > 0
        expect(page.locator("tr[data-worker=alice-gpu]")).to_contain_text("Start maintenance")

        expect(page.get_by_test_id("shared-keys")).to_have_count(0)
        create = page.get_by_test_id("shared-key-create")
        create.get_by_label("Name").fill("for my bot")
        create.locator("input[name=kudos]").fill("500")
        create.locator("input[name=max_text_tokens]").fill("256")
        create.get_by_role("button", name="Make a shared key").click()
        expect(page.locator("ul.messages")).to_contain_text("Made the shared key for my bot:")
        row = page.get_by_test_id("shared-keys").locator("tr[data-shared-key]")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("for my bot")
        expect(row).to_contain_text("500.00")
        shared_key = row.locator("code.shared-key").inner_text().strip()
        screenshot(page, "account")

        page.get_by_role("button", name=re.compile("Reset")).click()
        new_key = page.get_by_test_id("api-key").inner_text().strip()
        expect(page.get_by_test_id("api-key")).to_be_visible()
        screenshot(page, "account-reset", full_page=False)

    assert new_key and new_key != api_key
    old = httpx.get(f"{base}/api/v2/find_user", headers={"apikey": api_key})
    assert old.status_code == 401 and old.json()["rc"] == "InvalidAPIKey"
    found = httpx.get(f"{base}/api/v2/find_user", headers={"apikey": new_key})
    assert found.status_code == 200 and found.json()["username"] == f"alice#{account.pk}"
    made = SharedKey.objects.get(pk=shared_key)
    assert (made.account_id, made.name, made.kudos, made.max_text_tokens) == (
        account.pk,
        "for my bot",
        500,
        256,
    )
    through = httpx.get(f"{base}/api/v2/find_user", headers={"apikey": shared_key})
    assert through.json()["username"] == f"alice#{account.pk} (Shared Key: for my bot)"
