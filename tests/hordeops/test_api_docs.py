"""The schema, browsable at /api/ (Swagger UI), with its files served by this horde: no CDN.
The page in a real browser: tests/hordeops/test_api_docs_in_a_browser.py."""

import re

from django.contrib.staticfiles import finders


def test_the_api_docs_page_loads_swagger_ui_from_this_hordes_static_files(client):
    page = client.get("/api/")

    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html
    for source in sources:
        assert source.startswith("/static/drf_spectacular_sidecar/swagger-ui-dist/"), source
        # Each is a file collectstatic gathers and the static handler serves.
        assert finders.find(source.removeprefix("/static/")), source
    assert {s.rsplit("/", 1)[1] for s in sources} >= {"swagger-ui.css", "swagger-ui-bundle.js"}
    assert 'url: "/api/schema/"' in html
    # No script fetches from another host: no CDN, and not swagger.io's validator badge.
    assert "jsdelivr" not in html and '"validatorUrl": null' in html


def test_the_api_docs_page_sits_beside_the_routes_that_share_its_prefix(client, db):
    assert client.get("/api/schema/").status_code == 200
    # The AI Horde's serviceinfo names its docs `/api`: that finds them too.
    assert client.get("/api")["Location"] == "/api/"
    assert client.get("/api/v2/status/news").json() == []
    missing = client.get("/api/v2/no-such-route")
    assert (missing.status_code, missing.json()["rc"]) == (404, "NotFound")
