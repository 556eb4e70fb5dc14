"""The page a stranger lands on."""

import pytest


@pytest.mark.django_db
def test_the_home_page_says_what_this_horde_is(client):
    page = client.get("/")
    assert page.status_code == 200
    assert page["content-type"].startswith("text/html")
    assert b"crowdsourced text generation" in page.content
    assert b"/static/front/site.css" in page.content
