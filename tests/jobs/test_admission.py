"""Every requester route meets the horde-wide rules (`jobs/admission.py`): maintenance, the
account's suspension and the address's timeout each refuse all five, in the route's own error
shape, and nothing is queued or charged."""

import json
import time

import pytest
from rest_framework.test import APIClient

from hordeops import timeouts
from jobs.models import TextRequest
from kudos.models import Event
from workers import modes
from workers.models import Account, HordeModes

ADDRESS = "203.0.113.7"
CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "Hello"}]}
ROUTES = {
    "/api/v2/generate/text/async": {"prompt": "Once upon a time", "models": ["chat-model"]},
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "chat-model", "prompt": "Once upon a time"},
    "/v1/responses": {"model": "chat-model", "input": "Hello"},
    "/v1/messages": {**CHAT, "max_tokens": 64},
}
# The /v1 routes answer on a database thread: the tests commit what they set for it to see.
pytestmark = pytest.mark.django_db(transaction=True)
EVERY_ROUTE = pytest.mark.parametrize("path", list(ROUTES))
# Each rule: its status, its horde code and the OpenAI code it becomes.
RULES = {
    "maintenance": (400, "MaintenanceMode", "maintenance_mode"),
    "suspension": (403, "AccountSuspended", "account_suspended"),
    "timeout": (403, "TimeoutIP", "timeout_ip"),
}


def _maintenance(on: bool = True) -> None:
    HordeModes.objects.update_or_create(pk=1, defaults={"maintenance": on})
    modes.forget()


def _suspend(account: Account) -> None:
    Account.objects.filter(pk=account.pk).update(
        suspended_at="2026-06-01T12:00:00Z", suspension_reason="spam"
    )


def _time_out(address: str = ADDRESS) -> None:
    timeouts.publish({address: time.time() + 3600})


def _post(caller, path: str, body: dict | None = None, deadline_ms: int = 2000):
    """`path` called as `caller`, from ADDRESS, with a key as the route's clients send it."""
    body = body or ROUTES[path]
    client = APIClient(REMOTE_ADDR=ADDRESS)
    key = (
        {"HTTP_APIKEY": caller.api_key}
        if path.startswith("/api/")
        else {"HTTP_AUTHORIZATION": f"Bearer {caller.api_key}"}
    )
    # A request queued by mistake ends in 2 s rather than keeping the test's worker waiting.
    deadline = {"HTTP_X_MULTILLM_DEADLINE_MS": str(deadline_ms)}
    return client.post(path, json.dumps(body), content_type="application/json", **deadline, **key)


def _refused_as(refused, path: str, rule: str) -> None:
    """`refused` is the route's own answer to `rule`: its status, in its family's shape."""
    status, code, openai_code = RULES[rule]
    body = json.loads(refused.content)
    assert refused.status_code == status, body
    if path.startswith("/api/"):
        assert set(body) == {"message", "rc"} and body["rc"] == code
    elif path == "/v1/messages":
        error_type = "invalid_request_error" if status == 400 else "permission_error"
        assert body["type"] == "error" and body["error"]["type"] == error_type
    else:
        assert set(body) == {"error"} and body["error"]["code"] == openai_code
        assert body["error"]["type"] == "invalid_request_error"


def _nothing_queued() -> None:
    assert not TextRequest.objects.exists()
    assert not Event.objects.filter(kind=Event.Kind.TAX).exists()


@pytest.fixture
def serving(owner):
    """A worker that could serve every route's request: refused, it was refused by a rule."""
    owner.pop("chat-worker", models=["chat-model"], chat=True)


def _refused_by(rule: str, caller, path: str):
    """`path`'s answer to `caller`, refused by `rule` in the route's shape, nothing queued."""
    refused = _post(caller, path)
    _refused_as(refused, path, rule)
    _nothing_queued()
    return refused


@EVERY_ROUTE
def test_maintenance_refuses_each_requester_route_in_its_own_shape(path, requester, serving):
    _maintenance()
    refused = _refused_by("maintenance", requester, path)
    assert "maintenance mode" in refused.content.decode() and refused["retry-after"] == "60"


@EVERY_ROUTE
def test_a_suspended_account_is_refused_on_each_requester_route_in_its_own_shape(path, requester, serving):
    _suspend(requester.account)
    assert "spam" in _refused_by("suspension", requester, path).content.decode()  # the moderator's reason


@EVERY_ROUTE
def test_a_timed_out_address_is_refused_on_each_requester_route_in_its_own_shape(path, requester, serving):
    _time_out()
    assert _refused_by("timeout", requester, path)["retry-after"] == "3600"


@EVERY_ROUTE
def test_each_requester_route_queues_when_no_rule_refuses_it(path, requester, make_caller, serving):
    # The rules refuse only what they name: another account, another address, no maintenance.
    _suspend(make_caller().account)
    _time_out("198.51.100.9")
    _maintenance(on=False)
    answer = _post(requester, path, deadline_ms=500)  # a /v1 one waits out its deadline: 504
    assert answer.status_code in (202, 504), answer.content
    assert TextRequest.objects.filter(account=requester.account).count() == 1


def test_the_rules_refuse_in_the_ai_hordes_order_maintenance_suspension_timeout(requester, serving):
    # Maintenance comes first, before anything about the request: even a model no worker serves.
    _maintenance()
    _suspend(requester.account)
    _time_out()
    _refused_as(
        _post(requester, "/v1/chat/completions", {**CHAT, "model": "no-such-model"}), "/v1/", "maintenance"
    )
    _maintenance(on=False)
    _refused_as(_post(requester, "/api/v2/generate/text/async"), "/api/", "suspension")
    Account.objects.filter(pk=requester.account.pk).update(suspended_at=None)
    _refused_as(
        _post(requester, "/v1/completions", {"model": "no-such-model", "prompt": "x"}), "/v1/", "timeout"
    )
    _nothing_queued()


def test_a_dry_run_is_refused_in_maintenance_too(requester):
    _maintenance()
    refused = _post(requester, "/api/v2/generate/text/async", {"prompt": "Once", "dry_run": True})
    _refused_as(refused, "/api/", "maintenance")


def test_the_other_routes_still_refuse_a_timed_out_address_before_any_work(
    requester, django_assert_num_queries
):
    _time_out()
    with django_assert_num_queries(0):
        refused = APIClient(REMOTE_ADDR=ADDRESS).get("/api/v2/find_user", HTTP_APIKEY=requester.api_key)
    assert (refused.status_code, refused.json()["rc"]) == (403, "TimeoutIP")
