"""The API docs at /api/ in a real headless Chromium: Swagger UI draws the schema's operations
from files this horde serves, and no request leaves for another host.

Its screenshot goes to $SCREENSHOT_DIR as the admin's browser tests write theirs (docs/screenshots)."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.front.test_admin_in_a_browser import WIDE, chromium, screenshot
from tests.live import LiveStack

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)


def test_the_api_docs_list_the_operations_and_fetch_nothing_from_another_host(live_stack: LiveStack):
    base_url = live_stack.urls[0]
    here = urlsplit(base_url).netloc
    asked: list[str] = []
    failed: list[str] = []
    with chromium(WIDE) as page:
        page.on("request", lambda request: asked.append(request.url))
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.goto(f"{base_url}/api/")
        news = page.locator("#operations-api-status_news")
        expect(news).to_be_visible()
        expect(page.locator("#operations-api-heartbeat")).to_be_visible()
        # An operation tried from the page: the news, which needs no key, answered as JSON.
        news.locator(".opblock-summary").click()
        page.get_by_role("button", name="Try it out").click()
        page.get_by_role("button", name="Execute").click()
        expect(news.locator(".live-responses-table tbody .response-col_status")).to_have_text("200")
        news.locator(".opblock-summary").click()  # folded again: the picture is the page's top
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_load_state("networkidle")
        screenshot(page, "api_docs", full_page=False)

    assert failed == []
    hosts = {urlsplit(url).netloc for url in asked if not url.startswith("data:")}
    assert hosts == {here}, asked
    paths = {urlsplit(url).path for url in asked}
    assert {"/api/", "/api/schema/", "/api/v2/status/news"} <= paths
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in paths
