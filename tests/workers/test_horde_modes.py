"""The horde's modes, set by moderators in the admin: maintenance refuses new requests,
invite-only and raid refuse new workers of untrusted accounts; GET /status/modes reports them."""

from django.contrib.admin.models import LogEntry

from workers.models import Account, HordeModes, Worker

MODES_PAGE = "/admin/workers/hordemodes/1/change/"


def _set(moderator, **on: bool) -> None:
    answer = moderator.post(MODES_PAGE, {name: "on" for name, value in on.items() if value})
    assert answer.status_code == 302


def test_maintenance_set_in_the_admin_refuses_new_requests_and_is_reported_and_logged(
    moderator, requester, client
):
    assert requester.request_text().status_code == 202
    assert moderator.get("/admin/workers/hordemodes/").url == MODES_PAGE
    _set(moderator, maintenance=True)

    refused = requester.request_text()
    assert (refused.status_code, refused.json()["rc"]) == (400, "MaintenanceMode")
    assert refused["retry-after"] == "60"
    modes = requester.client.get("/api/v2/status/modes").json()
    assert modes == {"maintenance_mode": True, "invite_only_mode": False, "raid_mode": False}
    assert LogEntry.objects.filter(object_id="1", content_type__model="hordemodes").count() == 1

    _set(moderator, maintenance=False)
    assert requester.request_text().status_code == 202


def test_invite_only_refuses_an_untrusted_accounts_new_worker_but_not_the_ones_it_runs(
    moderator, owner, trusted_owner
):
    assert owner.pop("running").status_code == 200
    _set(moderator, invite_only=True)

    refused = owner.pop("newcomer")
    assert (refused.status_code, refused.json()["rc"]) == (403, "WorkerInviteOnly")
    assert not Worker.objects.filter(name="newcomer").exists()
    assert owner.pop("running").status_code == 200
    assert trusted_owner.pop("trusted-newcomer").status_code == 200


def test_raid_mode_refuses_new_untrusted_workers(moderator, owner, trusted_owner):
    _set(moderator, raid=True)
    assert owner.pop("raider").json()["rc"] == "RaidMode"
    assert trusted_owner.pop("defender").status_code == 200
    assert requester_modes(owner) == {"maintenance_mode": False, "invite_only_mode": False, "raid_mode": True}
    HordeModes.objects.filter(pk=1).update(raid=False)
    assert owner.pop("raider").status_code == 200  # read afresh where a worker is new


def requester_modes(caller) -> dict:
    return caller.client.get("/api/v2/status/modes").json()


def test_invite_only_lets_an_untrusted_account_start_the_workers_a_moderator_invited(moderator, owner):
    _set(moderator, invite_only=True)
    # The AI Horde's `worker_invited` (PUT /api/v2/users/{id}) is the account's worker limit.
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=1)

    assert owner.pop("invited").status_code == 200
    assert owner.pop("uninvited").json()["rc"] == "TooManyWorkers"
    _set(moderator, invite_only=True, raid=True)
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=2)
    assert owner.pop("raider").json()["rc"] == "RaidMode"  # an invitation does not pass a raid
