"""Shared keys' routes (`PUT /api/v2/sharedkeys`, `GET`/`PATCH`/`DELETE /api/v2/sharedkeys/{id}`),
`find_user` through one, transfers to one, and what a shared key may not do, as the AI Horde
rules them (`workers/shared_keys.py`)."""

import uuid
from datetime import timedelta
from decimal import Decimal
from email.utils import parsedate_to_datetime

import pytest
from rest_framework.test import APIClient

from hordeops import clock, errors
from kudos import ledger
from tests.conftest import give_kudos
from workers import shared_keys
from workers.models import SharedKey


def _create(caller, **body):
    return caller.client.put("/api/v2/sharedkeys", body, format="json", HTTP_APIKEY=caller.api_key)


def _patch(caller, key_id, **body):
    return caller.client.patch(
        f"/api/v2/sharedkeys/{key_id}", body, format="json", HTTP_APIKEY=caller.api_key
    )


def _delete(caller, key_id):
    return caller.client.delete(f"/api/v2/sharedkeys/{key_id}", HTTP_APIKEY=caller.api_key)


def _get(key_id):
    return APIClient().get(f"/api/v2/sharedkeys/{key_id}")


def _refused(response, status: int, rc: str) -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert set(body) <= {"message", "rc", "errors"} and body["rc"] == rc
    return body


def test_a_new_shared_key_has_the_ai_hordes_defaults_and_shape(requester):
    made = _create(requester, name="Mutual Aid")
    assert made.status_code == 200, made.content
    answer = made.json()
    key = SharedKey.objects.get()
    assert answer == {
        "id": str(key.pk),
        "username": f"requester#{requester.account.pk}",
        "name": "Mutual Aid",
        "kudos": 5000,
        "utilized": 0,
        "max_image_pixels": -1,
        "max_image_steps": -1,
        "max_text_tokens": -1,
    }
    assert (key.account, key.expiry, key.kudos) == (requester.account, None, Decimal(5000))


def test_a_shared_key_with_an_expiry_answers_it_as_an_rfc_822_date(requester):
    answer = _create(requester, name="month", kudos=-1, expiry=30, max_text_tokens=200).json()
    key = SharedKey.objects.get()
    assert abs(key.expiry - (clock.now() + timedelta(days=30))) < timedelta(minutes=1)
    # As the AI Horde writes it (flask-restx's rfc822: UTC, as "-0000").
    assert answer["expiry"].endswith(" -0000")
    assert parsedate_to_datetime(answer["expiry"]) == key.expiry.replace(microsecond=0, tzinfo=None)
    assert (answer["kudos"], answer["max_text_tokens"]) == (-1, 200)


def test_an_account_may_have_three_shared_keys_and_a_trusted_one_ten(make_caller):
    untrusted, trusted = make_caller(), make_caller(trusted=True)
    for _ in range(3):
        assert _create(untrusted, name="mine").status_code == 200
    body = _refused(_create(untrusted, name="fourth"), 403, "Forbidden")
    assert body["message"] == "You cannot have more than 3 shared keys."
    for _ in range(10):
        shared_keys.create_shared_key(owner=trusted.account, now=clock.now())
    with pytest.raises(Exception, match="more than 10 shared keys"):
        shared_keys.create_shared_key(owner=trusted.account, now=clock.now())
    assert SharedKey.objects.filter(account=untrusted.account).count() == 3


def test_an_account_makes_at_most_five_shared_keys_a_minute(make_caller):
    trusted = make_caller(trusted=True)
    for _ in range(5):
        assert _create(trusted, name="burst").status_code == 200
    refused = _refused(_create(trusted, name="sixth"), 429, "RateLimited")
    assert refused["message"].startswith("Too many requests")
    assert SharedKey.objects.count() == 5


def test_the_anonymous_account_and_a_shared_key_cannot_make_shared_keys(anonymous, requester):
    _refused(_create(anonymous, name="anon"), 403, "AnonForbidden")
    key = _create(requester, name="first").json()["id"]
    requester.api_key = key
    _refused(_create(requester, name="from a key"), 401, "InvalidAPIKey")
    assert SharedKey.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"kudos": "lots"},
        {"kudos": -2},
        {"kudos": 50_000_001},
        {"kudos": 1.5},
        {"expiry": -2},
        {"expiry": 10**9},
        {"name": "x" * 10_000},
        {"name": "ab"},
        {"name": 12},
        {"max_text_tokens": -5},
        {"max_image_steps": 501},
        ["not", "an", "object"],
    ],
)
def test_bad_settings_are_refused_in_the_horde_shape_and_nothing_is_made(requester, body):
    made = requester.client.put("/api/v2/sharedkeys", body, format="json", HTTP_APIKEY=requester.api_key)
    assert made.status_code == 400, made.content
    assert made.json()["rc"] == "BadRequest" or "errors" in made.json()
    assert not SharedKey.objects.exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"kudos": -2},
        {"kudos": 50_000_001},
        {"expiry": 36_501},
        {"max_text_tokens": 1_048_577},
        {"name": "ab"},
    ],
)
def test_the_services_hold_the_bounds_for_any_caller(requester, bad):
    with pytest.raises(errors.BadRequest):
        shared_keys.create_shared_key(owner=requester.account, now=clock.now(), **bad)
    key = shared_keys.create_shared_key(owner=requester.account, now=clock.now(), name="kept")
    with pytest.raises(errors.BadRequest):
        shared_keys.modify_shared_key(owner=requester.account, key_id=str(key.pk), now=clock.now(), **bad)
    assert list(SharedKey.objects.values_list("name", "kudos")) == [("kept", 5000)]


def test_anyone_with_a_shared_key_reads_its_details_and_an_unknown_one_is_401(requester):
    key = _create(requester, name="readable").json()
    assert _get(key["id"]).json() == key
    body = _refused(_get(uuid.uuid4()), 401, "InvalidAPIKey")
    assert body["message"] == "No user matching sent Shared Key."
    _refused(_get("not-a-uuid"), 401, "InvalidAPIKey")


def test_its_owner_changes_what_it_names_and_leaves_the_rest(requester):
    key = _create(requester, name="before", kudos=100, expiry=3).json()
    changed = _patch(requester, key["id"], name="after", max_text_tokens=64, expiry=-1)
    assert changed.status_code == 200, changed.content
    expected = {k: v for k, v in key.items() if k != "expiry"}
    assert changed.json() == {**expected, "name": "after", "max_text_tokens": 64}
    stored = SharedKey.objects.get()
    assert (stored.name, stored.kudos, stored.expiry, stored.max_text_tokens) == ("after", 100, None, 64)
    assert _patch(requester, key["id"], kudos=-1).json()["kudos"] == -1


def test_a_patch_that_changes_nothing_is_refused(requester):
    key = _create(requester, name="unchanged").json()
    body = _refused(_patch(requester, key["id"]), 400, "NoSharedKeyModSelected")
    assert body["message"] == "No shared key modification selected!"


def test_a_stranger_can_neither_change_nor_delete_anothers_key(requester, make_caller):
    stranger = make_caller("stranger")
    key = _create(requester, name="mine", kudos=10).json()
    body = _refused(_patch(stranger, key["id"], kudos=-1), 403, "Forbidden")
    assert body["message"] == (
        f"Shared Key {key['id']} belongs to requester#{requester.account.pk} "
        f"and not to stranger#{stranger.account.pk}."
    )
    _refused(_delete(stranger, key["id"]), 403, "Forbidden")
    stored = SharedKey.objects.get()
    assert stored.kudos == 10
    # An unknown key is told first, whoever asks; then a bad caller's key.
    _refused(_patch(stranger, uuid.uuid4(), kudos=1), 401, "InvalidAPIKey")
    stranger.api_key = "not-a-key-of-anyone"
    _refused(_patch(stranger, key["id"], kudos=1), 401, "InvalidAPIKey")


def test_a_deleted_key_is_gone_from_every_route(requester):
    key = _create(requester, name="short-lived").json()["id"]
    deleted = _delete(requester, key)
    assert (deleted.status_code, deleted.json()) == (200, {"message": "OK"})
    assert not SharedKey.objects.exists()
    _refused(_get(key), 401, "InvalidAPIKey")
    _refused(_delete(requester, key), 401, "InvalidAPIKey")
    used = requester.client.post(
        "/api/v2/generate/text/async", {"prompt": "hi"}, format="json", HTTP_APIKEY=key
    )
    _refused(used, 401, "InvalidAPIKey")


def test_find_user_lists_the_owners_keys_and_names_a_shared_keys_owner(requester):
    named = _create(requester, name="Mutual Aid").json()["id"]
    unnamed = SharedKey.objects.create(account=requester.account).pk
    mine = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).json()
    assert sorted(mine["sharedkey_ids"]) == sorted([named, str(unnamed)])
    through = APIClient().get("/api/v2/find_user", HTTP_APIKEY=named).json()
    assert through["username"] == f"requester#{requester.account.pk} (Shared Key: Mutual Aid)"
    assert through["id"] == requester.account.pk
    assert "sharedkey_ids" not in through and "worker_ids" not in through
    plain = APIClient().get("/api/v2/find_user", HTTP_APIKEY=str(unnamed)).json()
    assert plain["username"] == f"requester#{requester.account.pk} (Shared Key)"


def _transfer(caller, username, amount):
    return caller.post("/api/v2/kudos/transfer", {"username": username, "amount": amount})


def test_a_transfer_to_a_shared_keys_id_goes_to_its_owner_and_tops_it_up(requester, make_caller):
    giver = make_caller("giver")
    give_kudos(giver, "1000")
    key = _create(requester, name="topped", kudos=10).json()["id"]
    unlimited = _create(requester, name="unlimited", kudos=-1).json()["id"]
    sent = _transfer(giver, key, 50)
    assert (sent.status_code, sent.json()) == (200, {"transferred": 50})
    assert SharedKey.objects.get(pk=key).kudos == 60
    assert ledger.balance(requester.account.pk) == 50
    second = make_caller("second-giver")  # a key may transfer once a second
    give_kudos(second, "1000")
    assert _transfer(second, unlimited, 5).status_code == 200
    assert SharedKey.objects.get(pk=unlimited).kudos == -1
    # Its owner tops it up by PATCH: a transfer to one's own key is one to oneself.
    give_kudos(requester, "100")
    body = _refused(_transfer(requester, key, 5), 400, "KudosTransferToSelf")
    assert "yourself" in body["message"]


def test_a_transfer_to_an_expired_or_unknown_key_is_refused(requester, make_caller):
    giver = make_caller("giver")
    give_kudos(giver, "1000")
    key = SharedKey.objects.create(account=requester.account, expiry=clock.now() - timedelta(seconds=1))
    _refused(_transfer(giver, str(key.pk), 5), 400, "SharedKeyExpired")
    second = make_caller("second-giver")  # a key may transfer once a second
    _refused(_transfer(second, str(uuid.uuid4()), 5), 400, "InvalidTargetUsername")
    assert ledger.balance(requester.account.pk) == 0


def test_a_shared_key_cannot_transfer_kudos_or_run_a_worker(requester, make_caller):
    give_kudos(requester, "1000")
    other = make_caller("other")
    key = _create(requester, name="bounded").json()["id"]
    holder = make_caller("holder")
    holder.api_key = key
    _refused(_transfer(holder, f"other#{other.account.pk}", 5), 401, "InvalidAPIKey")
    _refused(holder.pop("key-worker"), 401, "InvalidAPIKey")
    assert ledger.balance(other.account.pk) == 0
