"""The account page's shared keys (`front/shared_keys.py`): the signed-in account lists, makes,
changes and deletes its own, under the `/api/v2/sharedkeys` routes' services and limits, each a
POST under CSRF; refusals are the forms' errors, and another account's key is left alone."""

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from hordeops import clock
from tests.front.test_account import page, signed_in
from workers import shared_keys
from workers.models import SharedKey

CREATE = "/account/shared-keys"


def _edit(key) -> str:
    return f"/account/shared-keys/{key.pk}/edit"


def _delete(key) -> str:
    return f"/account/shared-keys/{key.pk}/delete"


def _row(shown: str, key) -> str:
    return shown.split(f'data-shared-key="{key.pk}"')[1].split("</tr>")[0]


def _make(caller, **fields) -> SharedKey:
    return SharedKey.objects.create(account=caller.account, name=fields.pop("name", "bot"), **fields)


def _form(**fields) -> dict:
    return {"name": "", "kudos": "5000", "expiry": "-1", "max_text_tokens": "-1", **fields}


def test_the_page_lists_the_accounts_own_keys_with_their_id_budget_use_expiry_and_cap(requester, make_caller):
    expiry = clock.now() + timedelta(days=3)
    mine = _make(
        requester, name="Mutual Aid", kudos=Decimal("1234.50"), utilized=Decimal("65.5"), expiry=expiry
    )
    unlimited = _make(requester, name="open", kudos=-1, max_text_tokens=300)
    theirs = _make(make_caller("stranger"), name="not yours")
    shown = page(signed_in(requester))
    section = shown.split('<h2 id="shared-keys">')[1].split('aria-labelledby="ledger"')[0]
    assert "You have 2 of the 3 you may have." in section
    row = _row(section, mine)
    assert "Mutual Aid" in row and "<code" in row and str(mine.pk) in row
    assert (
        "1,234.50" in row and "65.50" in row and expiry.strftime("%Y-%m-%d %H:%M") in row and ">any<" in row
    )
    row = _row(section, unlimited)
    assert "unlimited" in row and ">300<" in row and ">never<" in row
    assert str(theirs.pk) not in shown and "not yours" not in shown


def test_the_create_form_offers_the_routes_defaults(requester):
    form = page(signed_in(requester)).split('data-testid="shared-key-create"')[1].split("</form>")[0]
    assert re.search(r'name="kudos" value="5000"', form)
    assert re.search(r'name="expiry" value="-1"', form) and re.search(
        r'name="max_text_tokens" value="-1"', form
    )


def test_a_key_made_on_the_page_is_the_routes_own_and_spends_for_its_owner(requester):
    client = signed_in(requester)
    answer = client.post(CREATE, _form(name="for my bot", kudos="300", expiry="30", max_text_tokens="200"))
    assert answer.status_code == 302 and answer["location"] == "/account#shared-keys"
    key = SharedKey.objects.get()
    assert (key.account, key.name, key.kudos, key.max_text_tokens) == (
        requester.account,
        "for my bot",
        300,
        200,
    )
    assert abs(key.expiry - (clock.now() + timedelta(days=30))) < timedelta(minutes=1)
    shown = page(client)
    assert f"Made the shared key for my bot: {key.pk}." in shown and str(key.pk) in _row(shown, key)
    details = APIClient().get(f"/api/v2/sharedkeys/{key.pk}").json()
    assert details["username"] == f"requester#{requester.account.pk}" and details["kudos"] == 300
    found = APIClient().get("/api/v2/find_user", HTTP_APIKEY=str(key.pk)).json()
    assert found["username"] == f"requester#{requester.account.pk} (Shared Key: for my bot)"


def test_a_fourth_key_is_refused_with_the_ai_hordes_words_and_a_trusted_account_may_have_ten(
    requester, make_caller
):
    client = signed_in(requester)
    for _ in range(3):
        assert client.post(CREATE, _form()).status_code == 302
    refused = client.post(CREATE, _form(name="fourth"))
    assert refused.status_code == 400
    assert "You cannot have more than 3 shared keys." in refused.content.decode()
    assert SharedKey.objects.filter(account=requester.account).count() == 3

    trusted = make_caller("trusted", trusted=True)
    for _ in range(10):
        shared_keys.create_shared_key(owner=trusted.account, now=clock.now())
    shown = signed_in(trusted, address="203.0.113.8").post(CREATE, _form()).content.decode()
    assert "You cannot have more than 10 shared keys." in shown and "You have 10 of the 10" in shown


def test_the_page_spends_the_routes_rate_of_five_keys_a_minute(make_caller):
    trusted = make_caller("trusted", trusted=True)
    for _ in range(5):
        made = trusted.client.put("/api/v2/sharedkeys", {}, format="json", HTTP_APIKEY=trusted.api_key)
        assert made.status_code == 200
    refused = signed_in(trusted).post(CREATE, _form(name="sixth"))
    assert refused.status_code == 400 and "Too many requests" in refused.content.decode()
    assert SharedKey.objects.count() == 5


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"kudos": "-2"}, "greater than or equal to -1"),
        ({"kudos": "50000001"}, "less than or equal to 50000000"),
        ({"kudos": "lots"}, "Enter a whole number."),
        ({"expiry": "36501"}, "less than or equal to 36500"),
        ({"max_text_tokens": "-5"}, "greater than or equal to -1"),
        ({"max_text_tokens": "1048577"}, "less than or equal to 1048576"),
        ({"name": "ab"}, "at least 3 characters"),
        ({"name": "x" * 256}, "at most 255 characters"),
        ({"kudos": ""}, "This field is required."),
    ],
)
def test_settings_out_of_the_routes_bounds_are_the_forms_errors_and_make_nothing(requester, fields, error):
    refused = signed_in(requester).post(CREATE, _form(**fields))
    assert refused.status_code == 400
    assert error in refused.content.decode()
    assert not SharedKey.objects.exists()


def test_the_anonymous_account_makes_no_key_on_the_page(anonymous):
    refused = signed_in(anonymous).post(CREATE, _form(name="anon"))
    assert refused.status_code == 400
    assert "Anonymous user is forbidden from performing this operation" in refused.content.decode()
    assert not SharedKey.objects.exists()


def test_the_owner_changes_what_the_form_gives_and_empty_fields_stay(requester):
    key = _make(
        requester, name="before", kudos=100, expiry=clock.now() + timedelta(days=2), max_text_tokens=64
    )
    client = signed_in(requester)
    answer = client.post(_edit(key), {"name": "after", "kudos": "", "expiry": "-1", "max_text_tokens": ""})
    assert answer.status_code == 302
    key.refresh_from_db()
    assert (key.name, key.kudos, key.expiry, key.max_text_tokens) == ("after", 100, None, 64)
    assert f"Changed the shared key {key.pk}." in page(client)
    assert client.post(_edit(key), {"kudos": "-1"}).status_code == 302
    key.refresh_from_db()
    assert (key.name, key.kudos) == ("after", -1)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "No shared key modification selected!"),
        ({"name": "ab"}, "at least 3 characters"),
        ({"kudos": "-7"}, "greater than or equal to -1"),
        ({"expiry": "100000"}, "less than or equal to 36500"),
    ],
)
def test_a_refused_change_is_shown_on_that_keys_form_and_changes_nothing(requester, fields, error):
    key = _make(requester, name="kept", kudos=100)
    other = _make(requester, name="other")
    refused = signed_in(requester).post(_edit(key), fields)
    assert refused.status_code == 400
    shown = refused.content.decode()
    form = shown.split(f'data-shared-key-edit="{key.pk}"')[1].split("</tr>")[0]
    assert error in form and "<details open>" in form
    assert "<details open>" not in shown.split(f'data-shared-key-edit="{other.pk}"')[1].split("</tr>")[0]
    key.refresh_from_db()
    assert (key.name, key.kudos) == ("kept", 100)


def test_a_strangers_key_can_be_neither_changed_nor_deleted_from_the_page(requester, make_caller):
    stranger = make_caller("stranger")
    theirs = _make(stranger, name="theirs", kudos=10)
    client = signed_in(requester)
    changed = client.post(_edit(theirs), {"kudos": "-1", "name": "mine now"})
    assert changed.status_code == 400
    belongs = (
        f"Shared Key {theirs.pk} belongs to stranger#{stranger.account.pk} "
        f"and not to requester#{requester.account.pk}."
    )
    assert belongs in changed.content.decode()
    deleted = client.post(_delete(theirs))
    assert deleted.status_code == 400 and belongs in deleted.content.decode()
    theirs.refresh_from_db()
    assert (theirs.account, theirs.name, theirs.kudos) == (stranger.account, "theirs", 10)
    out_of_bounds = client.post(_edit(theirs), {"name": "ab"})
    assert out_of_bounds.status_code == 400
    assert "No shared key of yours has this id." in out_of_bounds.content.decode()
    gone = client.post(f"/account/shared-keys/{uuid.uuid4()}/delete")
    assert gone.status_code == 400 and "No shared key has this id" in gone.content.decode()


def test_a_key_deleted_on_the_page_is_refused_at_once(requester):
    key = _make(requester, name="short-lived")
    kept = _make(requester, name="kept")
    client = signed_in(requester)
    answer = client.post(_delete(key))
    assert answer.status_code == 302
    assert list(SharedKey.objects.all()) == [kept]
    shown = page(client)
    assert f"Deleted the shared key {key.pk}" in shown and f'data-shared-key="{key.pk}"' not in shown
    used = APIClient().post(
        "/api/v2/generate/text/async", {"prompt": "hi"}, format="json", HTTP_APIKEY=str(key.pk)
    )
    assert used.status_code == 401 and used.json()["rc"] == "InvalidAPIKey"


def _signed_in_under_csrf(caller) -> Client:
    client = Client(enforce_csrf_checks=True, REMOTE_ADDR="203.0.113.7")
    form = client.get("/account").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    answer = client.post("/account", {"apikey": caller.api_key, "csrfmiddlewaretoken": token})
    assert answer.status_code == 302
    return client


@pytest.mark.parametrize("action", ["create", "edit", "delete"])
def test_a_post_without_its_csrf_token_changes_no_key(requester, action):
    key = _make(requester, name="guarded", kudos=10)
    path = {"create": CREATE, "edit": _edit(key), "delete": _delete(key)}[action]
    client = _signed_in_under_csrf(requester)
    assert client.post(path, _form(name="forged", kudos="-1")).status_code == 403
    assert list(SharedKey.objects.values_list("name", "kudos")) == [("guarded", 10)]
    # With the token, the same client may: the refusal was the token's.
    token = client.cookies["csrftoken"].value
    assert client.post(path, {**_form(name="allowed"), "csrfmiddlewaretoken": token}).status_code == 302


@pytest.mark.parametrize("action", ["create", "edit", "delete"])
def test_a_signed_out_post_is_the_sign_in_form_and_changes_no_key(requester, action):
    key = _make(requester, name="guarded", kudos=10)
    path = {"create": CREATE, "edit": _edit(key), "delete": _delete(key)}[action]
    answer = Client().post(path, _form(name="forged", kudos="-1"))
    assert answer.status_code == 403
    shown = answer.content.decode()
    assert 'name="apikey"' in shown and "Sign in first." in shown
    assert list(SharedKey.objects.values_list("name", "kudos")) == [("guarded", 10)]
