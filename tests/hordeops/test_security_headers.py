"""No page of hordeops may be framed by another site (clickjacking of moderator actions)."""

import pytest


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/admin/login/", "/admin/", "/api/v2/status/heartbeat", "/api/v2/no-such-route", "/metrics"]
)
def test_every_page_tells_browsers_not_to_frame_it(client, path):
    response = client.get(path)
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.django_db
def test_a_moderators_admin_pages_are_not_framed_either(admin_client):
    response = admin_client.get("/admin/workers/account/")
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY"
