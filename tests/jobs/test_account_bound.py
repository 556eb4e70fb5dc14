"""An account has at most its bound of waiting or running requests (docs/reference/horde_api.md)."""

import threading

import pytest
from django.db import connections

from jobs.models import TextRequest
from jobs.services import cancel_request

MESSAGE = (
    "Parallel requests (3) exceeded user limit (3). "
    "Please try again later or request to increase your concurrency."
)


@pytest.fixture(autouse=True)
def _bounds(settings):
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 3
    settings.ANONYMOUS_MAX_WAITING_REQUESTS = 2


@pytest.fixture
def served(owner):
    """Workers of m1 (text) and chat-model (chat), so that requests for either are accepted."""
    owner.pop("text-worker", models=["m1"])
    owner.pop("chat-worker", models=["chat-model"], chat=True)


def _fill(caller, count: int) -> list[str]:
    ids = []
    for i in range(count):
        response = caller.request_text(f"prompt {i}", models=["m1"])
        assert response.status_code == 202, response.content
        ids.append(response.json()["id"])
    return ids


def test_the_request_past_the_bound_is_429_TooManyPrompts_with_retry_after(requester, served):
    _fill(requester, 3)
    refused = requester.request_text("one more", models=["m1"])
    assert refused.status_code == 429
    assert refused.json() == {"message": MESSAGE, "rc": "TooManyPrompts"}
    assert refused["retry-after"] == "5"
    assert TextRequest.objects.filter(account=requester.account).count() == 3


def test_a_finished_or_cancelled_request_frees_its_place(requester, owner, served):
    ids = _fill(requester, 3)
    cancel_request(request_id=ids[0])
    assert requester.request_text("again", models=["m1"]).status_code == 202
    assert requester.request_text("and again", models=["m1"]).status_code == 429
    job = owner.pop("text-worker", models=["m1"]).json()
    assert owner.submit(job["id"], "done").status_code == 200
    assert requester.request_text("after a reply", models=["m1"]).status_code == 202


def test_a_running_request_still_counts(requester, owner, served):
    _fill(requester, 3)
    assert owner.pop("text-worker", models=["m1"]).json()["id"]
    assert requester.request_text("more", models=["m1"]).status_code == 429


def test_a_dry_run_is_neither_refused_nor_counted(requester, served):
    _fill(requester, 3)
    assert requester.request_text("dry", models=["m1"], dry_run=True).status_code == 200


def test_bounds_are_per_account(requester, make_caller, served):
    _fill(requester, 3)
    assert make_caller("other").request_text("mine", models=["m1"]).status_code == 202


def _chat(caller, path: str = "/v1/chat/completions", **headers):
    body = {"model": "chat-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    if path == "/v1/responses":
        body = {"model": "chat-model", "input": "hi", "max_output_tokens": 20}
    if path == "/v1/messages":
        headers.setdefault("HTTP_X_API_KEY", caller.api_key)
    else:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {caller.api_key}")
    return caller.client.post(path, body, format="json", **headers)


def test_v1_requests_count_and_are_refused_in_the_openai_shape(requester, served):
    _fill(requester, 3)
    refused = _chat(requester)
    assert refused.status_code == 429
    assert refused["retry-after"] == "5"
    assert refused.json() == {
        "error": {"message": MESSAGE, "type": "rate_limit_error", "param": None, "code": "too_many_prompts"}
    }
    responses = _chat(requester, "/v1/responses")
    assert responses.status_code == 429 and responses.json()["error"]["type"] == "rate_limit_error"


def test_v1_messages_are_refused_in_the_anthropic_shape(requester, served):
    _fill(requester, 3)
    refused = _chat(requester, "/v1/messages")
    assert refused.status_code == 429
    assert refused["retry-after"] == "5"
    assert refused.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": MESSAGE}}


def test_a_moderators_value_for_the_account_wins_over_the_setting(requester, served):
    requester.account.max_waiting_requests = 5
    requester.account.save()
    _fill(requester, 5)
    assert requester.request_text("sixth", models=["m1"]).status_code == 429
    requester.account.max_waiting_requests = 0
    requester.account.save()
    assert requester.request_text("none at all", models=["m1"]).status_code == 429


def test_the_anonymous_accounts_bound_is_its_own_and_shared_by_everyone_using_it(anonymous, served):
    assert anonymous.account.waiting_requests_limit == 2
    _fill(anonymous, 2)
    refused = anonymous.request_text("third", models=["m1"])
    assert refused.status_code == 429 and refused.json()["rc"] == "TooManyPrompts"


@pytest.mark.django_db(transaction=True)
def test_requests_sent_at_once_cannot_overshoot_the_bound(make_caller, settings):
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 5
    requester, owner = make_caller("racer"), make_caller("racing-owner")
    owner.pop("text-worker", models=["m1"])
    start = threading.Barrier(20)
    codes: list[int] = []

    def send(i: int) -> None:
        try:
            start.wait()
            codes.append(requester.request_text(f"at once {i}", models=["m1"]).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes) == [202] * 5 + [429] * 15
    assert TextRequest.objects.filter(account=requester.account).count() == 5
