"""A moderator times out a worker's address without seeing it, as the AI Horde's
`/api/v2/operations/block_worker_ipaddr/{worker_id}` does (`workers/services.py`
`block_worker_address`, served by `workers/views.py`)."""

from datetime import datetime, timedelta

import pytest
from rest_framework.test import APIClient

from workers.models import Account, AddressTimeout, Worker

T0 = "2026-06-01 12:00:00+00:00"
URL = "/api/v2/operations/block_worker_ipaddr"


@pytest.fixture
def mod_key(make_caller):
    caller = make_caller("a-moderator")
    Account.objects.filter(pk=caller.account.pk).update(moderator=True)
    return caller


def _from(caller, address: str):
    caller.client = APIClient(REMOTE_ADDR=address)
    return caller


def block(caller, worker_id, days=1):
    return caller.client.put(f"{URL}/{worker_id}", {"days": days}, format="json", HTTP_APIKEY=caller.api_key)


def unblock(caller, worker_id):
    return caller.client.delete(f"{URL}/{worker_id}", HTTP_APIKEY=caller.api_key)


def test_a_moderator_blocks_a_workers_address_for_days_without_seeing_it_and_lifts_it(
    clock, mod_key, owner, make_caller
):
    _from(owner, "203.0.113.7").pop("raider")
    worker = Worker.objects.get(name="raider")

    blocked = block(mod_key, worker.pk, days=2)

    assert (blocked.status_code, blocked.json()) == (200, {"message": "OK"})
    assert "203.0.113.7" not in blocked.content.decode()
    row = AddressTimeout.objects.get()
    assert (row.network, row.until, row.reason) == (
        "203.0.113.7",
        datetime.fromisoformat(T0) + timedelta(days=2),
        "address of worker raider",
    )
    assert row.created_by == f"a-moderator#{mod_key.account.pk}"
    # Everything from that address is refused, the worker's pops too; other addresses are not.
    assert owner.pop("raider").json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "203.0.113.7").request_text().json()["rc"] == "TimeoutIP"
    assert _from(make_caller(), "203.0.113.8").request_text().status_code == 202

    lifted = unblock(mod_key, worker.pk)
    assert (lifted.status_code, lifted.json()) == (200, {"message": "OK"})
    assert not AddressTimeout.objects.exists()
    assert owner.pop("raider").status_code == 200


def test_an_ipv6_workers_address_is_blocked_as_its_64(mod_key, owner, make_caller):
    _from(owner, "2001:db8:7:1::42").pop("v6")
    assert block(mod_key, Worker.objects.get(name="v6").pk).status_code == 200
    assert AddressTimeout.objects.get().network == "2001:db8:7:1::/64"
    assert _from(make_caller(), "2001:db8:7:1::99").request_text().json()["rc"] == "TimeoutIP"


def test_only_a_moderator_blocks_and_a_bad_worker_or_duration_is_refused_in_the_horde_shape(
    mod_key, owner, requester
):
    _from(owner, "203.0.113.7").pop("w")
    worker = Worker.objects.get(name="w")
    refused = block(requester, worker.pk)
    assert (refused.status_code, refused.json()["rc"]) == (403, "NotModerator")
    assert unblock(requester, worker.pk).json()["rc"] == "NotModerator"
    assert owner.client.put(f"{URL}/{worker.pk}", {"days": 1}, format="json").json()["rc"] == "InvalidAPIKey"
    for days in (0, 31, "1", None):
        answer = block(mod_key, worker.pk, days=days)
        assert (answer.status_code, answer.json()["rc"]) == (400, "ValidationError"), days
    for unknown in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        missing = block(mod_key, unknown)
        assert (missing.status_code, missing.json()) == (
            404,
            {"message": f"Worker with ID '{unknown}' not found.", "rc": "WorkerNotFound"},
        )
    assert not AddressTimeout.objects.exists()


def test_a_worker_on_the_horde_s_own_host_or_without_an_address_is_a_400_that_hides_it(mod_key, owner):
    owner.pop("local")  # the test client's 127.0.0.1: loopback, never put into timeout
    local = block(mod_key, Worker.objects.get(name="local").pk)
    assert (local.status_code, local.json()["rc"]) == (400, "BadRequest")
    assert "127.0.0.1" not in local.content.decode()
    Worker.objects.filter(name="local").update(address="")
    unknown = block(mod_key, Worker.objects.get(name="local").pk)
    assert (unknown.status_code, unknown.json()["rc"]) == (400, "BadRequest")
    assert not AddressTimeout.objects.exists()
