"""The operator's documents on the AI Horde's routes: the news, the terms, the privacy policy,
the sponsors and `/.well-known/serviceinfo`, each in the AI Horde's shape (its
`horde/apis/models/v2.py` `Newspiece` and `HordeDocument`, its `routes.serviceinfo`), empty but
valid until someone writes them, and what moderators and the operator write in the admin."""

from datetime import date

import pytest
from django.contrib.admin.models import LogEntry

from front.models import HordeDocument, Newspiece

# The AI Horde's fields, from its source (Haidra-Org/AI-Horde, horde/apis/models/v2.py, routes.py).
NEWSPIECE_FIELDS = {"date_published", "newspiece", "importance", "tags", "title", "more_info_urls"}
SERVICEINFO_FIELDS = {"version", "software", "api"}
SOFTWARE_FIELDS = {"name", "version", "repository", "homepage", "logo"}
AIHORDE_API_FIELDS = {"name", "version", "base_url", "rel_url", "documentation"}
DOCUMENTS = ("terms", "privacy", "sponsors")

pytestmark = pytest.mark.django_db


def test_the_news_is_an_empty_list_until_someone_writes_some(client):
    answer = client.get("/api/v2/status/news")
    assert (answer.status_code, answer.json()) == (200, [])


def test_the_news_lists_every_piece_newest_first_in_the_ai_hordes_fields(client):
    Newspiece.objects.create(date_published=date(2026, 1, 5), title="Older", newspiece="First.")
    Newspiece.objects.create(
        date_published=date(2026, 3, 1),
        title="Workers wanted",
        newspiece="Run a [bridge](https://example.org/bridge).",
        importance=Newspiece.Importance.WORKERS,
        tags=["workers", "bridge"],
        more_info_urls=["https://example.org/bridge"],
    )
    Newspiece.objects.create(date_published=date(2026, 3, 1), title="Same day, later", newspiece="Second.")

    news = client.get("/api/v2/status/news").json()

    assert [piece["title"] for piece in news] == ["Same day, later", "Workers wanted", "Older"]
    assert all(set(piece) == NEWSPIECE_FIELDS for piece in news)
    assert news[1] == {
        "date_published": "2026-03-01",
        "newspiece": "Run a [bridge](https://example.org/bridge).",
        "importance": "Workers",
        "tags": ["workers", "bridge"],
        "title": "Workers wanted",
        "more_info_urls": ["https://example.org/bridge"],
    }
    assert (news[2]["importance"], news[2]["tags"], news[2]["more_info_urls"]) == ("Information", [], [])


@pytest.mark.parametrize("kind", DOCUMENTS)
def test_an_unwritten_document_is_empty_in_the_format_asked(client, kind):
    assert client.get(f"/api/v2/documents/{kind}").json() == {"html": ""}
    assert client.get(f"/api/v2/documents/{kind}?format=html").json() == {"html": ""}
    assert client.get(f"/api/v2/documents/{kind}?format=markdown").json() == {"markdown": ""}


@pytest.mark.parametrize("kind", DOCUMENTS)
def test_a_document_answers_the_format_asked_as_the_operator_wrote_it(client, kind):
    HordeDocument.objects.create(kind=kind, html=f"<h1>{kind}</h1>", markdown=f"# {kind}")
    HordeDocument.objects.create(kind=next(k for k in DOCUMENTS if k != kind), html="<p>another</p>")

    html = client.get(f"/api/v2/documents/{kind}")
    markdown = client.get(f"/api/v2/documents/{kind}", {"format": "markdown"})

    assert (html.status_code, html["Content-Type"], html.json()) == (
        200,
        "application/json",
        {"html": f"<h1>{kind}</h1>"},
    )
    assert markdown.json() == {"markdown": f"# {kind}"}


@pytest.mark.parametrize("wanted", ["json", "HTML", "", "pdf"])
def test_a_document_in_a_format_the_ai_horde_does_not_serve_is_refused_in_its_error_shape(client, wanted):
    refused = client.get("/api/v2/documents/terms", {"format": wanted})
    assert refused.status_code == 400
    assert refused.json() == {
        "message": "'format' needs to be one of ['html', 'markdown']",
        "rc": "BadRequest",
    }


def test_serviceinfo_names_this_horde_and_its_api_at_the_address_asked_by_default(client, settings):
    settings.ALLOWED_HOSTS = ["horde.example.org"]
    answer = client.get("/.well-known/serviceinfo", HTTP_HOST="horde.example.org")

    assert answer.status_code == 200
    info = answer.json()
    assert set(info) == SERVICEINFO_FIELDS and info["version"] == "0.2"
    # Unset, the repository and the logo are left out rather than sent empty.
    assert info["software"] == {
        "name": "hordeops",
        "version": "2.5.0",
        "homepage": "http://horde.example.org",
    }
    assert set(info["api"]) == {"aihorde"}
    assert info["api"]["aihorde"] == {
        "name": "AI Horde API",
        "version": "2.5",
        "base_url": "http://horde.example.org/api/v2",
        "rel_url": "/api/v2",
        "documentation": "http://horde.example.org/api/",
    }


def test_serviceinfo_says_what_the_operator_set(client, settings):
    settings.ALLOWED_HOSTS = ["*"]
    settings.HORDE_TITLE = "Example Horde"
    settings.HORDE_URL = "https://horde.example.org"
    settings.HORDE_REPOSITORY = "https://git.example.org/horde"
    settings.HORDE_LOGO = "https://horde.example.org/logo.png"

    info = client.get("/.well-known/serviceinfo", HTTP_HOST="10.0.0.5:8000").json()

    assert set(info["software"]) == SOFTWARE_FIELDS
    assert info["software"] == {
        "name": "Example Horde",
        "version": "2.5.0",
        "repository": "https://git.example.org/horde",
        "homepage": "https://horde.example.org",
        "logo": "https://horde.example.org/logo.png",
    }
    assert set(info["api"]["aihorde"]) == AIHORDE_API_FIELDS
    assert info["api"]["aihorde"]["base_url"] == "https://horde.example.org/api/v2"


def test_pages_on_any_origin_may_read_serviceinfo_and_the_documents(client):
    for path in ("/.well-known/serviceinfo", "/api/v2/status/news", "/api/v2/documents/privacy"):
        answer = client.get(path, HTTP_ORIGIN="https://app.example.org")
        assert answer["Access-Control-Allow-Origin"] == "*", path


def test_serviceinfo_answers_only_a_read(client):
    assert client.head("/.well-known/serviceinfo").status_code == 200
    assert client.post("/.well-known/serviceinfo").status_code == 405


def test_a_moderator_writes_the_news_in_the_admin_and_the_route_serves_it(moderator, client):
    added = moderator.post(
        "/admin/front/newspiece/add/",
        {
            "date_published": "2026-12-06",
            "title": "Maintenance tonight",
            "importance": "Upcoming",
            "newspiece": "The horde pauses at 22:00 UTC.",
            "tags": "maintenance,ops",
            "more_info_urls": "https://status.example.org",
        },
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    assert LogEntry.objects.filter(object_repr__contains="Maintenance tonight").exists()

    news = client.get("/api/v2/status/news").json()

    assert news == [
        {
            "date_published": "2026-12-06",
            "newspiece": "The horde pauses at 22:00 UTC.",
            "importance": "Upcoming",
            "tags": ["maintenance", "ops"],
            "title": "Maintenance tonight",
            "more_info_urls": ["https://status.example.org"],
        }
    ]


def test_a_moderator_reads_the_documents_but_only_the_operator_writes_them(moderator, admin_client):
    assert moderator.get("/admin/front/hordedocument/").status_code == 200
    assert moderator.get("/admin/front/hordedocument/add/").status_code == 403
    terms = {"kind": "terms", "html": "<p>Be kind.</p>", "markdown": "Be kind."}
    assert moderator.post("/admin/front/hordedocument/add/", terms).status_code == 403

    assert admin_client.post("/admin/front/hordedocument/add/", terms).status_code == 302

    assert HordeDocument.objects.get(kind="terms").markdown == "Be kind."


def test_the_schema_names_the_documents_format_and_the_news_fields(client):
    schema = client.get("/api/schema/?format=json").json()
    terms = schema["paths"]["/api/v2/documents/terms"]["get"]
    (fmt,) = [p for p in terms["parameters"] if p["name"] == "format"]
    assert (fmt["in"], fmt["schema"]["enum"], fmt["schema"]["default"]) == (
        "query",
        ["html", "markdown"],
        "html",
    )
    document = schema["components"]["schemas"]["HordeDocument"]["properties"]
    assert set(document) == {"html", "markdown"}
    # An unwritten document is "", which the answer's schema allows.
    assert "minLength" not in document["html"] and "minLength" not in document["markdown"]
    news = schema["paths"]["/api/v2/status/news"]["get"]["responses"]["200"]["content"]["application/json"]
    assert news["schema"]["items"]["$ref"] == "#/components/schemas/Newspiece"
    assert set(schema["components"]["schemas"]["Newspiece"]["properties"]) == NEWSPIECE_FIELDS
