"""Requests through a shared key (`workers/shared_keys.py`, spent by `jobs/services/requests.py`
`_queue`): its owner's, within its budget, its expiry and its token cap, on the horde's route
and on the /v1 routes, and never past its last kudos however two requests race."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from hordeops import clock, errors
from jobs.models import TextRequest
from jobs.services import create_reply_request, create_text_request
from kudos import ledger
from kudos.models import Event
from tests.conftest import race
from workers.models import Account, SharedKey

# The default request (80 tokens naming no model, 2,048 context): 80 x 13 x 3.4 / 100, and the
# horde tax of 1.
COST = Decimal("35.36") + 1
ASYNC = "/api/v2/generate/text/async"


def _key(caller, **fields) -> SharedKey:
    return SharedKey.objects.create(account=caller.account, name="bot", **fields)


def _ask(key, **body):
    return APIClient().post(
        ASYNC, {"prompt": "Once upon a time", **body}, format="json", HTTP_APIKEY=str(key.pk)
    )


def _refused(response, status: int, rc: str) -> str:
    body = response.json()
    assert response.status_code == status, body
    assert set(body) == {"message", "rc"} and body["rc"] == rc
    return body["message"]


def _nothing_queued(owner) -> None:
    assert not TextRequest.objects.exists()
    assert not Event.objects.exists()
    assert ledger.balance(owner.account.pk) == 0


def test_a_request_through_a_shared_key_is_its_owners_and_spends_its_budget(requester):
    key = _key(requester, kudos=100)
    queued = _ask(key)
    assert queued.status_code == 202, queued.content
    request = TextRequest.objects.get()
    assert request.account == requester.account and request.kudos_reserved + 1 == COST
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (100 - COST, COST)
    assert queued.json()["kudos"] == round(COST)
    assert Event.objects.get(key=f"tax:{request.pk}").postings.filter(wallet__account=requester.account)
    # Unlimited: the budget stays unlimited, what it used still counts up.
    unlimited = _key(requester, kudos=-1)
    assert _ask(unlimited).status_code == 202
    unlimited.refresh_from_db()
    assert (unlimited.kudos, unlimited.utilized) == (-1, COST)


def test_a_dry_run_through_a_shared_key_spends_nothing(requester):
    key = _key(requester, kudos=100)
    assert _ask(key, dry_run=True).json() == {"kudos": round(COST)}
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (100, 0)


def test_a_request_past_the_keys_token_cap_is_refused_with_the_ai_hordes_words(requester):
    key = _key(requester, max_text_tokens=50)
    message = _refused(_ask(key, params={"max_length": 80}), 400, "BadRequest")
    assert message == "This shared key is limited to 50 tokens per job. You requested 80 tokens."
    _nothing_queued(requester)
    assert _ask(key, params={"max_length": 50}).status_code == 202


def test_a_request_past_what_is_left_of_the_budget_is_refused(requester):
    key = _key(requester, kudos=10)
    message = _refused(_ask(key), 403, "SharedKeyInsufficientKudos")
    assert (
        message
        == f"This shared key does not have enough remaining kudos (10) to fulfill this request ({COST})."
    )
    _nothing_queued(requester)
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (10, 0)


def test_an_expired_key_is_refused(requester):
    key = _key(requester, expiry=clock.now() - timedelta(seconds=1))
    assert _refused(_ask(key), 403, "SharedKeyExpired") == "This shared key has expired"
    assert _refused(_ask(key, allow_downgrade=True), 403, "SharedKeyExpired")
    _nothing_queued(requester)


def test_a_spent_key_is_refused_unless_the_request_allows_a_downgrade_to_anonymous(requester, anonymous):
    key = _key(requester, kudos=COST)
    assert _ask(key).status_code == 202
    key.refresh_from_db()
    assert key.kudos == 0
    assert _refused(_ask(key), 403, "SharedKeyEmpty") == "This shared key has run out of kudos."
    downgraded = _ask(key, allow_downgrade=True)
    assert downgraded.status_code == 202, downgraded.content
    assert TextRequest.objects.get(pk=downgraded.json()["id"]).account == anonymous.account
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (0, COST)


def test_a_key_deleted_or_expired_after_it_was_read_is_refused_as_the_request_is_queued(requester):
    deleted, expiring = _key(requester), _key(requester)
    SharedKey.objects.filter(pk=deleted.pk).delete()
    SharedKey.objects.filter(pk=expiring.pk).update(expiry=clock.now() - timedelta(seconds=1))
    for stale, refusal in ((deleted, errors.SharedKeyNotFound), (expiring, errors.SharedKeyExpired)):
        with pytest.raises(refusal):
            _queue_through(requester, stale)
    assert not TextRequest.objects.exists()


def test_a_request_refused_by_the_accounts_bound_gives_the_budget_back(requester):
    Account.objects.filter(pk=requester.account.pk).update(max_waiting_requests=0)
    key = _key(requester, kudos=100)
    _refused(_ask(key), 429, "TooManyPrompts")
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (100, 0)


def test_queueing_with_an_account_key_reads_no_shared_key(requester):
    with CaptureQueriesContext(connection) as statements:
        assert requester.request_text().status_code == 202
    assert not [s for s in statements.captured_queries if SharedKey._meta.db_table in s["sql"]]


def _queue_through(owner, key: SharedKey):
    return create_text_request(
        account=owner.account,
        address="",
        prompt="Once upon a time",
        params={"max_length": 80, "max_context_length": 2048},
        models=[],
        workers=[],
        trusted_workers=False,
        slow_workers=True,
        dry_run=False,
        shared_key=key,
    )


@pytest.mark.django_db(transaction=True)
def test_two_requests_racing_on_a_keys_last_kudos_cannot_both_pass(make_caller):
    owner = make_caller("racing-owner")
    key = _key(owner, kudos=COST + COST / 2)  # one request's worth, and half of another's
    results = race(
        lambda: _queue_through(owner, key), lambda: _queue_through(owner, key), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == 1 and isinstance(refused[0], errors.SharedKeyInsufficientKudos), results
    assert TextRequest.objects.count() == 1
    key.refresh_from_db()
    assert (key.kudos, key.utilized) == (COST / 2, COST)


# --- the /v1 routes ------------------------------------------------------------------------


def _chat_worker(owner) -> None:
    served = owner.pop(
        "chat-worker", models=["chat-model"], chat=True, max_length=4096, max_context_length=8192
    )
    assert served.status_code == 200, served.content


def _v1(path: str, key: SharedKey, body: dict, *, header: str = "bearer", deadline_ms: int = 1000):
    auth = (
        {"HTTP_AUTHORIZATION": f"Bearer {key.pk}"} if header == "bearer" else {"HTTP_X_API_KEY": str(key.pk)}
    )
    return APIClient().post(
        path,
        json.dumps(body),
        content_type="application/json",
        HTTP_X_MULTILLM_DEADLINE_MS=str(deadline_ms),
        **auth,
    )


CHAT = {"model": "chat-model", "messages": [{"role": "user", "content": "Hello"}]}


@pytest.mark.django_db(transaction=True)
def test_a_chat_request_with_a_shared_key_as_its_bearer_spends_the_keys_budget(make_caller):
    owner = make_caller("chat-owner")
    _chat_worker(owner)
    key = _key(owner, kudos=1000)
    # Nobody serves it: its deadline ends it, after it was queued and paid for.
    answered = _v1("/v1/chat/completions", key, {**CHAT, "max_tokens": 64})
    assert answered.status_code == 504, answered.content
    request = TextRequest.objects.get()
    assert request.account == owner.account
    key.refresh_from_db()
    assert key.utilized == request.kudos_reserved + 1 and key.kudos == 1000 - key.utilized


@pytest.mark.django_db(transaction=True)
def test_a_v1_request_without_max_tokens_is_held_to_the_keys_cap(make_caller):
    owner = make_caller("capped-owner")
    _chat_worker(owner)
    key = _key(owner, max_text_tokens=100)
    request = create_reply_request(
        account=owner.account,
        address="",
        model="chat-model",
        messages=[{"role": "user", "content": "hi"}],
        max_length=None,
        params={},
        shared_key=key,
    )
    assert request.max_length == 100


@pytest.mark.django_db(transaction=True)
def test_the_v1_routes_refuse_a_key_past_its_cap_or_expiry_in_their_own_shapes(make_caller):
    owner = make_caller("v1-owner")
    _chat_worker(owner)
    capped = _key(owner, max_text_tokens=32)
    refused = _v1("/v1/messages", capped, {**CHAT, "max_tokens": 64}, header="x-api-key")
    body = refused.json()
    assert refused.status_code == 400 and body["type"] == "error", body
    assert "limited to 32 tokens per job" in body["error"]["message"]
    expired = _key(owner, expiry=clock.now() - timedelta(seconds=1))
    refused = _v1("/v1/chat/completions", expired, CHAT)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "shared_key_expired"
    models = APIClient().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {capped.pk}")
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["chat-model"]
    assert APIClient().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {expired.pk}").status_code == 403
    assert not TextRequest.objects.exists()
