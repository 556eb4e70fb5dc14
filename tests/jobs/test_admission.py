"""Every requester route refuses in maintenance mode, each in its own error shape, and queues nothing."""

import json

import pytest

from jobs.models import TextRequest
from workers import modes
from workers.models import HordeModes

CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "Hello"}]}
V1_ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "chat-model", "prompt": "Once upon a time"},
    "/v1/responses": {"model": "chat-model", "input": "Hello"},
    "/v1/messages": {**CHAT, "max_tokens": 64},
}


@pytest.fixture
def maintenance(db):
    HordeModes.objects.update_or_create(pk=1, defaults={"maintenance": True})
    modes.forget()
    yield
    modes.forget()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", list(V1_ROUTES))
def test_maintenance_refuses_each_v1_route_in_its_own_shape(path, maintenance, requester, owner):
    owner.pop("chat-worker", models=["chat-model"], chat=True)  # a worker that could serve it
    refused = requester.client.post(
        path, json.dumps(V1_ROUTES[path]), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {requester.api_key}",
        HTTP_X_MULTILLM_DEADLINE_MS="2000",  # queued by mistake, it ends in 2 s rather than never
    )  # fmt: skip
    assert refused.status_code == 400, refused.content
    body = json.loads(refused.content)
    if path == "/v1/messages":
        assert body["type"] == "error" and "maintenance mode" in body["error"]["message"]
    else:
        assert set(body) == {"error"} and "maintenance mode" in body["error"]["message"]
        assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", "maintenance_mode")
    assert refused["retry-after"] == "60"
    assert not TextRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_maintenance_refuses_the_hordes_async_route(maintenance, requester):
    refused = requester.request_text()
    assert (refused.status_code, refused.json()["rc"]) == (400, "MaintenanceMode")
    assert not TextRequest.objects.exists()
