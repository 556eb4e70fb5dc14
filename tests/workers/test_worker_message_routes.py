"""Messages to workers on the AI Horde's routes (`/api/v2/workers/messages`, served by
`front/worker_messages.py` with `workers/messages.py`'s rules): moderators write to any worker,
owners to their own, each worker's pops carry them, and the refusals are the AI Horde's."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, DELETION, LogEntry

from workers.models import Account, Worker, WorkerMessage

T0 = "2026-06-01 12:00:00+00:00"
URL = "/api/v2/workers/messages"


@pytest.fixture
def api_moderator(make_caller):
    caller = make_caller("boss")
    Account.objects.filter(pk=caller.account.pk).update(moderator=True)
    caller.account.refresh_from_db()
    return caller


def send(caller, worker_id, message="Your replies are cut short.", **body):
    return caller.post(URL, {"worker_id": str(worker_id), "message": message, **body})


def listed(caller, **params):
    return caller.client.get(URL, params, HTTP_APIKEY=caller.api_key)


def delete(caller, message_id):
    return caller.client.delete(f"{URL}/{message_id}", HTTP_APIKEY=caller.api_key)


def worker_of(caller, name):
    caller.pop(name)
    return Worker.objects.get(name=name)


def test_a_moderator_writes_a_message_to_a_worker_and_its_next_pop_carries_it(
    clock, api_moderator, owner, make_caller
):
    worker = worker_of(owner, "told")
    other = make_caller()
    other.pop("untold")

    sent = send(api_moderator, worker.pk, origin="Mods", expiry=2)

    assert sent.status_code == 200, sent.content
    row = WorkerMessage.objects.get()
    assert sent.json() == {
        "id": str(row.pk),
        "worker_id": str(worker.pk),
        "user_id": str(api_moderator.account.pk),
        "message": "Your replies are cut short.",
        "origin": "Mods",
        "expiry": "Mon, 01 Jun 2026 14:00:00 -0000",
        "created": "Mon, 01 Jun 2026 12:00:00 -0000",
    }
    assert owner.pop("told").json()["messages"] == [
        {key: sent.json()[key] for key in ("id", "message", "origin", "expiry")}
    ]
    assert other.pop("untold").json()["messages"] == []
    # Logged in the admin's history as a moderator's act there is, naming the account.
    [entry] = LogEntry.objects.all()
    assert (entry.action_flag, entry.object_id) == (ADDITION, str(row.pk))
    assert entry.change_message == f"Sent through the API by boss#{api_moderator.account.pk}"
    # A key's account has no sign-in user: the entry is the inactive API user's.
    assert (entry.user.username, entry.user.is_active, entry.user.has_usable_password()) == (
        "horde-api",
        False,
        False,
    )

    clock.shift(timedelta(hours=2))
    assert owner.pop("told").json()["messages"] == []


def test_an_owner_writes_to_and_reads_their_workers_messages_the_moderators_too(
    clock, api_moderator, owner, make_caller
):
    worker = worker_of(owner, "mine")
    second = worker_of(owner, "mine-too")
    stranger = make_caller("stranger")
    elsewhere = worker_of(stranger, "theirs")
    from_mod = send(api_moderator, worker.pk, "Check your backend.").json()
    send(api_moderator, elsewhere.pk, "Not for the owner.")
    own = send(owner, second.pk, "A note to myself", origin="ignored", expiry=1)
    assert own.status_code == 200, own.content
    # An owner's origin is their id, as on the AI Horde; their writes are not a moderator's act.
    assert own.json()["origin"] == str(owner.account.pk)
    assert LogEntry.objects.count() == 2

    read = listed(owner)
    assert read.status_code == 200
    assert [m["message"] for m in read.json()] == ["Check your backend.", "A note to myself"]
    assert read.json()[0] == from_mod
    assert [m["message"] for m in listed(owner, worker_id=str(second.pk)).json()] == ["A note to myself"]
    assert listed(owner, user_id=str(owner.account.pk)).json() == read.json()

    clock.shift(timedelta(hours=1))
    assert [m["message"] for m in listed(owner).json()] == ["Check your backend."]
    assert [m["message"] for m in listed(owner, validity="expired").json()] == ["A note to myself"]
    assert len(listed(owner, validity="all").json()) == 2
    # A moderator reads every worker's, or one account's workers' with user_id.
    assert len(listed(api_moderator, validity="all").json()) == 3
    assert [m["message"] for m in listed(api_moderator, user_id=str(stranger.account.pk)).json()] == [
        "Not for the owner."
    ]
    # Anyone holding a message's id may read it, as on the AI Horde.
    single = stranger.client.get(f"{URL}/{from_mod['id']}")
    assert (single.status_code, single.json()) == (200, from_mod)


def test_a_stranger_is_refused_with_the_ai_hordes_codes(api_moderator, owner, make_caller):
    worker = worker_of(owner, "guarded")
    stranger = make_caller("stranger")
    by_mod = send(api_moderator, worker.pk).json()
    by_owner = send(owner, worker.pk, "mine").json()

    refused = send(stranger, worker.pk)
    assert (refused.status_code, refused.json()["rc"]) == (403, "MessagesOnlyOwnWorkers")
    assert refused.json()["message"] == "You can only send messages to your own workers."
    peek = listed(stranger, user_id=str(owner.account.pk))
    assert (peek.status_code, peek.json()) == (
        403,
        {"message": "You can only view your own messages.", "rc": "Forbidden"},
    )
    # The stranger's own list has none of the owner's worker's messages.
    assert listed(stranger).json() == []
    for message_id in (by_mod["id"], by_owner["id"]):
        gone = delete(stranger, message_id)
        assert (gone.status_code, gone.json()["rc"]) == (403, "Forbidden")
    # The owner may delete what they wrote, not what a moderator wrote to their worker.
    assert delete(owner, by_mod["id"]).json()["rc"] == "Forbidden"
    assert WorkerMessage.objects.count() == 2


def test_anonymous_and_keyless_callers_are_refused(anonymous, owner):
    worker = worker_of(owner, "w")
    refused = send(anonymous, worker.pk)
    assert (refused.status_code, refused.json()["rc"]) == (403, "AnonForbidden")
    keyless = owner.client.get(URL)
    assert (keyless.status_code, keyless.json()["rc"]) == (401, "InvalidAPIKey")
    wrong = owner.client.post(
        URL, {"worker_id": str(worker.pk), "message": "hi"}, format="json", HTTP_APIKEY="x" * 22
    )
    assert (wrong.status_code, wrong.json()["rc"]) == (401, "InvalidAPIKey")
    assert owner.client.delete(f"{URL}/1").json()["rc"] == "InvalidAPIKey"
    assert not WorkerMessage.objects.exists()


def test_a_deleted_message_leaves_the_pops_at_once_and_a_moderators_delete_is_logged(api_moderator, owner):
    worker = worker_of(owner, "w")
    message_id = send(api_moderator, worker.pk).json()["id"]
    own_id = send(owner, worker.pk, "mine").json()["id"]
    assert len(owner.pop("w").json()["messages"]) == 2

    assert (delete(api_moderator, message_id).json(), delete(owner, own_id).json()) == (
        {"message": "OK"},
        {"message": "OK"},
    )

    assert owner.pop("w").json()["messages"] == []
    missing = owner.client.get(f"{URL}/{message_id}")
    assert (missing.status_code, missing.json()) == (
        404,
        {"message": f"Workermessage with ID '{message_id}' not found.", "rc": "WorkermessageNotFound"},
    )
    assert delete(api_moderator, message_id).json()["rc"] == "WorkermessageNotFound"
    assert [entry.action_flag for entry in LogEntry.objects.order_by("pk")] == [ADDITION, DELETION]


W = "the worker's id"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"message": "no worker"},
        {"worker_id": "not-a-uuid", "message": "hi"},
        {"worker_id": 7, "message": "hi"},
        {"worker_id": W},
        {"worker_id": W, "message": ""},
        {"worker_id": W, "message": 5},
        {"worker_id": W, "message": "x" * 10241},
        {"worker_id": W, "message": "hi", "expiry": 0},
        {"worker_id": W, "message": "hi", "expiry": 721},
        {"worker_id": W, "message": "hi", "expiry": "12"},
        {"worker_id": W, "message": "hi", "origin": ""},
        {"worker_id": W, "message": "hi", "origin": "o" * 256},
    ],
)
def test_a_bad_message_is_a_400_in_the_horde_shape(api_moderator, owner, body):
    worker = worker_of(owner, "w")
    body = {key: str(worker.pk) if value == W else value for key, value in body.items()}
    refused = api_moderator.post(URL, body)
    assert refused.status_code == 400, refused.content
    assert set(refused.json()) == {"message", "rc", "errors"}
    assert refused.json()["message"] == "Input payload validation failed"
    assert not WorkerMessage.objects.exists()


@pytest.mark.parametrize(
    "params",
    [
        {"validity": "soon"},
        {"page": "0"},
        {"page": "two"},
        {"page": "-1"},
        {"worker_id": "123"},
        {"user_id": "alice"},
        {"user_id": "9" * 40},
    ],
)
def test_a_bad_listing_query_is_a_400_in_the_horde_shape(api_moderator, params):
    refused = listed(api_moderator, **params)
    assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest"), refused.content


def test_messages_come_fifty_a_page_and_an_unknown_worker_is_a_404(api_moderator, owner):
    worker = worker_of(owner, "w")
    WorkerMessage.objects.bulk_create(
        WorkerMessage(worker=worker, message=f"m{i}", expiry=worker.created_at + timedelta(days=1))
        for i in range(51)
    )
    assert len(listed(owner).json()) == 50
    assert [m["message"] for m in listed(owner, page="2").json()] == ["m50"]
    assert listed(owner, page="3").json() == []
    # Written in the admin: no user_id, as the AI Horde leaves a None out.
    assert "user_id" not in listed(owner).json()[0]

    unknown = send(api_moderator, "00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 404
    assert unknown.json() == {
        "message": "Worker with ID '00000000-0000-0000-0000-000000000000' not found.",
        "rc": "WorkerNotFound",
    }
