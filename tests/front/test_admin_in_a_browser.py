"""The moderator's pages in a real headless Chromium (Debian's), driven by Playwright.

A live uvicorn serves the admin on the test database; the browser logs in through the
login form, as a moderator would. Playwright's sync API runs an event loop in this thread
while a browser is open, and Django refuses ORM calls from a thread with a running loop:
so each test prepares its rows before `chromium()` and checks them after it.

Screenshots go to $SCREENSHOT_DIR (run/screenshots unless set); the README shows the ones
made with `SCREENSHOT_DIR=docs/screenshots bin/test tests/front/test_admin_in_a_browser.py`.
"""

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from bench.fill import fill
from hordeops import metrics
from jobs.models import TextRequest
from tests.conftest import queue_chat
from tests.live import ROOT, LiveStack
from workers.models import Account
from workers.moderation import grant_moderators

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "run" / "screenshots"))
PASSWORD = "a moderator's password"
VIEWPORT = {"width": 1440, "height": 900}  # the narrowest a moderator's pages must fit
WIDE = {"width": 1920, "height": 1080}  # a common desktop screen


@contextmanager
def chromium(viewport: dict[str, int] = VIEWPORT) -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            # As root in a container: no sandbox, no GPU, /dev/shm may be small.
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            page = browser.new_page(viewport=viewport)
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def screenshot(page: Page, name: str, *, full_page: bool = True) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=full_page)


def log_in(page: Page, base_url: str, next_path: str) -> None:
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.get_by_label("Username").fill("moderator")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(re.escape(next_path) + "$"))
    # The navigation sidebar stays open, as Django shows it first: every list must fit beside it.
    expect(page.locator("#nav-sidebar")).to_be_visible()


@pytest.fixture
def moderator_user(transactional_db) -> User:
    user = User.objects.create_user("moderator", password=PASSWORD, is_staff=True)
    user.groups.add(grant_moderators(Group, Permission))
    return user


def _pop(base_url: str, api_key: str, **body) -> dict:
    answer = httpx.post(
        f"{base_url}/api/v2/generate/text/pop",
        headers={"apikey": api_key},
        json={"name": "browser-worker", "models": ["chat-model"], "chat": True, **body},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_moderator_untrusts_an_account_and_its_next_pop_gets_the_untrusted_cap(
    live_stack: LiveStack, moderator_user, make_caller
):
    base_url = live_stack.urls[0]
    owner = make_caller("volunteer-owner", trusted=True)
    for name, trusted in (("alice", True), ("bob", False), ("carol", True)):
        make_caller(name, trusted=trusted)
    requester = make_caller("requester")
    assert _pop(base_url, owner.api_key)["id"] is None  # checks the worker in
    for _ in range(2):
        requester.request_text(models=["chat-model"])

    with chromium() as page:
        trusted_pop = _pop(base_url, owner.api_key)
        log_in(page, base_url, "/admin/workers/account/")
        row = page.locator("#result_list tbody tr", has_text="volunteer-owner")
        row.locator("input[name=_selected_action]").check()
        page.locator("select[name=action]").select_option("untrust")
        page.get_by_role("button", name="Go").click()
        expect(page.locator("ul.messagelist")).to_contain_text("Untrusted 1 account(s).")
        expect(row.locator("input[name$=-trusted]")).not_to_be_checked()
        screenshot(page, "accounts")
        untrusted_pop = _pop(base_url, owner.api_key)

    assert trusted_pop["lease"]["cap_seconds"] == 600
    assert untrusted_pop["lease"]["cap_seconds"] == 200
    assert Account.objects.get(name="volunteer-owner").trusted is False
    [entry] = LogEntry.objects.filter(object_repr="volunteer-owner")
    assert entry.user == moderator_user and entry.change_message.startswith("Untrusted")


def test_a_live_generations_seconds_left_counts_down_in_the_page(
    live_stack: LiveStack, moderator_user, make_caller
):
    fill(accounts=5, workers=40, generations=400)  # four more live leases, popped earlier
    base_url = live_stack.urls[0]
    owner, requester = make_caller("volunteer"), make_caller("requester")
    declared = {"chat": True, "max_length": 1024, "max_context_length": 8192}
    assert _pop(base_url, owner.api_key, **declared)["id"] is None
    queue_chat(requester, 512, "Write a long story.")
    job = _pop(base_url, owner.api_key, **declared)
    popped = time.monotonic()
    assert job["id"]

    with chromium() as page:
        # The page's clock is Playwright's: the countdown is read after exactly 5 s of it.
        page.clock.install()
        log_in(page, base_url, "/admin/jobs/generation/?lease=live")
        cell = page.locator(".lease-seconds-left").first  # the newest pop: ours
        first = int(cell.inner_text())
        # The page was rendered at most this long after the pop: a loaded machine takes longer.
        rendered_within = time.monotonic() - popped
        page.clock.run_for(5_000)
        after = int(cell.inner_text())
        screenshot(page, "generations_live")

    assert 150 - rendered_within - 1 <= first <= 150
    assert after == first - 5


def test_the_operations_page_and_the_worker_list_render_in_the_browser(
    live_stack: LiveStack, moderator_user, make_caller
):
    fill(accounts=20, workers=300, generations=400, queued=60)
    base_url = live_stack.urls[0]
    # An hour of history, counted through the function the services count with: renewals in
    # every past minute, stale aborts and capacity-limited pops now and then. Up to 58 minutes
    # back, so that all of it is still in the page's hour if a minute ends while this runs.
    now = timezone.now()
    for minutes_ago in range(1, 59):
        when = now - timedelta(minutes=minutes_ago)
        metrics.increment(
            metrics.LEASE_RENEWALS, "granted", "trusted", amount=20 + minutes_ago % 13, now=when
        )
        metrics.increment(metrics.LEASE_RENEWALS, "granted", "untrusted", amount=minutes_ago % 7, now=when)
        if minutes_ago % 9 == 0:
            metrics.increment(metrics.STALE_ABORTS, "untrusted", amount=1 + minutes_ago % 4, now=when)
        if minutes_ago % 5 == 0:
            metrics.increment(metrics.POP_LEASE_CAPACITY_LIMITED, amount=2, now=when)

    with chromium() as page:
        log_in(page, base_url, "/admin/operations/")
        expect(page.locator("#ops-processing .value")).to_have_text(re.compile(r"^\d+$"))
        expect(page.locator("svg.ops-chart")).to_have_count(7)
        renewal_bars = page.locator("svg.ops-chart").first.locator("rect").count()
        # The admin's stylesheet came through the stack's own static handler.
        assert page.evaluate("getComputedStyle(document.querySelector('#header')).display") == "flex"
        processing = int(page.locator("#ops-processing .value").inner_text())
        screenshot(page, "operations")
        page.goto(f"{base_url}/admin/workers/worker/")
        expect(page.locator('#result_list span[title="unmeasured"]').first).to_have_text("new")
        screenshot(page, "workers", full_page=False)  # the first screen of 100 rows

    assert processing == 400 // 50
    assert renewal_bars >= 58  # one per busy minute (the current one may be busy too)


# Every list a moderator reads, with the columns each must show, and each list's first detail.
LISTS = {
    "/admin/workers/account/": [
        "name",
        "trusted",
        "suspended",
        "flagged",
        "suspicions",
        "requests 1 h",
        "requests 24 h",
        "tokens 1 h",
        "tokens 24 h",
        "given back",
        "uncompleted",
        "kudos",
    ],
    "/admin/workers/worker/": [
        "models",
        "capacity",
        "limited",
        "last seen",
        "online",
        "jobs done",
        "given back",
        "uncompleted",
        "maintenance",
        "aborts (1 h)",
        "bridge agent",
    ],
    "/admin/jobs/textrequest/": ["id", "models", "account", "ending", "state", "created"],
    "/admin/jobs/generation/": ["left (s)", "lease end", "capacity", "tier", "limited"],
}


def _broken_words(page: Page) -> list[str]:
    """Words of the lists' cells split across two lines ("Processi / ng"): a break at a hyphen,
    a slash or a space is a line break, one inside a run of letters and digits is not."""
    return page.evaluate(
        """() => {
          const broken = [];
          for (const cell of document.querySelectorAll('#result_list td, #result_list th')) {
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
              for (const word of node.data.matchAll(/[\\p{L}\\p{N}]+/gu)) {
                const range = document.createRange();
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
                if (tops.size > 1) broken.push(word[0]);
              }
            }
          }
          return broken;
        }"""
    )


def _overflow(page: Page) -> list[str]:
    """Tables (or the page) wider than the window: what would be clipped on the right."""
    return page.evaluate(
        """() => {
          // A table wider than the window, or than the box that holds it (the admin's lists
          // sit in a box that scrolls sideways: what overflows it is off-screen too).
          const root = document.documentElement, width = root.clientWidth;
          const right = e => e.getBoundingClientRect().right;
          const wide = [...document.querySelectorAll('table')]
            .filter(t => right(t) > width + 1 || right(t) > right(t.parentElement) + 1)
            .map(t => (t.id || t.className || 'table') + ' ' + Math.round(t.getBoundingClientRect().right));
          if (root.scrollWidth > width + 1) wide.push('page ' + root.scrollWidth);
          return wide;
        }"""
    )


@pytest.mark.parametrize("viewport", [VIEWPORT, WIDE], ids=["1440", "1920"])
def test_a_moderator_walks_every_list_and_detail_page_with_nothing_clipped_or_split(
    live_stack: LiveStack, moderator_user, make_caller, viewport: dict[str, int]
):
    fill(accounts=10, workers=60, generations=120, queued=30)
    base_url = live_stack.urls[0]
    owner, requester = make_caller("walk-owner"), make_caller("walk-requester")
    _pop(base_url, owner.api_key)  # the worker checks in: its model can be asked for
    chat = queue_chat(requester, 300)
    ids = {"request": str(chat.pk), "generation": _pop(base_url, owner.api_key)["id"]}
    seen: dict[str, list[str]] = {}
    overflowing: dict[str, list[str]] = {}
    split: dict[str, list[str]] = {}
    suffix = "" if viewport == VIEWPORT else f"_{viewport['width']}"
    with chromium(viewport) as page:
        log_in(page, base_url, "/admin/workers/account/")
        for path, columns in LISTS.items():
            page.goto(base_url + path)
            headers = [h.strip().lower() for h in page.locator("#result_list thead th").all_inner_texts()]
            seen[path] = [c for c in columns if not any(c in h for h in headers)]
            overflowing[path] = _overflow(page)
            split[path] = _broken_words(page)
            if path == "/admin/jobs/textrequest/":
                screenshot(page, "requests" + suffix, full_page=False)
            if path == "/admin/jobs/generation/" and viewport == WIDE:
                screenshot(page, "generations" + suffix, full_page=False)
            page.locator("#result_list tbody tr th a, #result_list tbody tr td a").first.click()
            page.wait_for_selector("#content-main")
            overflowing[page.url] = _overflow(page)
        # The request with a generation: its page lists it inline; its generation's page
        # shows the lease end as a time and no raw ttl.
        page.goto(f"{base_url}/admin/jobs/textrequest/{ids['request']}/change/")
        inline = page.locator(".inline-group").inner_text()
        overflowing["request detail"] = _overflow(page)
        screenshot(page, "request_detail" + suffix)
        page.goto(f"{base_url}/admin/jobs/generation/{ids['generation']}/change/")
        generation_page = page.locator("#content-main").inner_text()
        overflowing["generation detail"] = _overflow(page)
        page.goto(f"{base_url}/admin/operations/")
        overflowing["operations"] = _overflow(page)
        page.goto(f"{base_url}/admin/")
        overflowing["index"] = _overflow(page)
        view_site = page.get_by_role("link", name="View site").count()
        icon = page.locator("link[rel=icon]").count()
        sections = page.locator("#content-main").inner_text()

    assert seen == {path: [] for path in LISTS}, seen
    assert {where: wide for where, wide in overflowing.items() if wide} == {}
    assert {where: words for where, words in split.items() if words} == {}
    assert ids["generation"][:8] in inline and "processing" in inline.lower()
    assert re.search(r"Lease end:?\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", generation_page), generation_page
    assert "Job ttl" not in generation_page
    assert view_site == 0 and icon == 1
    assert "Requests" in sections and "Text requests" not in sections


def test_a_moderator_stops_a_raid_from_the_admin_each_step_with_its_reason(
    live_stack: LiveStack, moderator_user, make_caller
):
    from hordeops import timeouts
    from workers.models import AddressTimeout, HordeModes, Suspicion, Worker

    base_url = live_stack.urls[0]
    raider = make_caller("raider-1")
    make_caller("volunteer-1")
    for _ in range(3):
        raider.request_text(models=["raid-model"])
    _pop(base_url, raider.api_key, name="raider-worker")
    worker = Worker.objects.get(name="raider-worker")
    for n in range(5):
        Suspicion.objects.create(
            account=raider.account,
            worker=worker,
            reason=Suspicion.Reason.UNREASONABLY_FAST,
            detail=f"{1400 + n} t/s > 150 t/s for koboldcpp/Raid-13B",
        )
    Account.objects.filter(pk=raider.account.pk).update(flagged_at=timezone.now())

    with chromium() as page:
        log_in(page, base_url, "/admin/workers/account/?flagged=yes")
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        screenshot(page, "moderation_flagged_accounts", full_page=False)
        page.get_by_role("link", name="raider-1").first.click()
        expect(page.locator(".inline-group")).to_contain_text("1404 t/s > 150 t/s")
        screenshot(page, "moderation_account_suspicions")

        page.goto(f"{base_url}/admin/workers/account/?flagged=yes")
        page.locator("#result_list input[name=_selected_action]").first.check()
        page.locator("select[name=action]").select_option("suspend")
        page.get_by_role("button", name="Go").click()
        expect(page.locator("#content-main")).to_contain_text("raider-1")
        page.get_by_label("Reason").fill("A raid: workers far faster than their model.")
        screenshot(page, "moderation_reason", full_page=False)
        page.get_by_role("button", name="Suspend accounts").click()
        expect(page.locator("ul.messagelist")).to_contain_text("Suspended 1 account(s).")

        page.goto(f"{base_url}/admin/workers/addresstimeout/add/")
        page.get_by_label("Network").fill("203.0.113.0/24")
        page.get_by_label("Hours").fill("24")
        page.get_by_label("Reason").fill("The raid's network.")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator("#result_list")).to_contain_text("203.0.113.0/24")
        screenshot(page, "moderation_address_timeouts", full_page=False)

        page.goto(f"{base_url}/admin/workers/hordemodes/")
        page.get_by_label("Raid").check()
        page.get_by_role("button", name="Save", exact=True).click()
        page.goto(f"{base_url}/admin/workers/hordemodes/")
        screenshot(page, "moderation_modes", full_page=False)

    suspended = Account.objects.get(pk=raider.account.pk)
    assert suspended.suspension_reason == "A raid: workers far faster than their model."
    assert TextRequest.objects.filter(account=suspended, state="cancelled").count() == 3
    assert AddressTimeout.objects.get().network == "203.0.113.0/24"
    assert timeouts.seconds_left("203.0.113.77") > 23 * 3600
    assert HordeModes.objects.get(pk=1).raid is True
    messages = set(LogEntry.objects.values_list("change_message", flat=True))
    assert "Suspended (open requests cancelled): A raid: workers far faster than their model." in messages
