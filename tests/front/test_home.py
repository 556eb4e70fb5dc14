"""The page a stranger lands on: what the horde is, what is online now, and where to go next."""

import re

import pytest

from workers.models import HordeModes


@pytest.mark.django_db
def test_the_home_page_says_what_this_horde_is(client):
    page = client.get("/")
    assert page.status_code == 200
    assert page["content-type"].startswith("text/html")
    assert b"crowdsourced text generation" in page.content
    assert b"/static/front/site.css" in page.content


@pytest.mark.django_db
def test_the_home_page_links_to_sign_up_the_account_page_the_docs_and_the_api_docs(client, settings):
    settings.DOCS_URL = "https://docs.example/hordeops"
    page = client.get("/").content.decode()
    for link in ("/register", "/account", "https://docs.example/hordeops", "/api/", "/api/schema/"):
        assert f'href="{link}"' in page, link


@pytest.mark.django_db
def test_the_home_page_shows_the_workers_models_and_queue_online_now(client, make_caller):
    owner, requester = make_caller("owner"), make_caller("requester")
    assert owner.pop(name="w1", models=["llama-3-8b"]).status_code == 200
    assert owner.pop(name="w2", models=["llama-3-8b", "mistral-7b"]).status_code == 200
    assert requester.request_text(models=["mistral-7b"]).status_code == 202
    page = client.get("/").content.decode()
    online = re.search(r'<ul data-testid="online">(.*?)</ul>', page, re.S).group(1)
    assert "<strong>2</strong> workers" in online
    assert "<strong>1</strong> request in the queue" in online
    models = re.search(r'<table data-testid="models">(.*?)</table>', page, re.S).group(1)
    assert "<td>llama-3-8b</td><td>2</td>" in models and "<td>mistral-7b</td><td>1</td>" in models


@pytest.mark.django_db
def test_the_home_page_says_when_nothing_is_served_and_when_the_horde_is_in_maintenance(client):
    HordeModes.objects.update_or_create(pk=1, defaults={"maintenance": True})
    page = client.get("/").content.decode()
    assert "No model is served right now." in page
    assert 'data-testid="maintenance"' in page
