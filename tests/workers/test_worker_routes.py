"""GET /api/v2/workers, /workers/{id}, /workers/name/{name} and PUT /workers/{id}, as the AI
Horde answers them."""

from datetime import timedelta

from django.utils import timezone

from kudos.models import TextModel
from workers.models import Account, Worker


def _details(caller, path, **headers):
    return caller.client.get(path, **headers)


def test_the_workers_list_shows_the_online_text_workers_in_the_ai_hordes_shape(requester, owner):
    owner.pop("online-worker", models=["m1"], max_length=256, threads=2)
    owner.pop("gone-worker", models=["m2"])
    Worker.objects.filter(name="gone-worker").update(last_pop_at=timezone.now() - timedelta(hours=1))
    listed = requester.client.get("/api/v2/workers?type=text").json()
    assert [w["name"] for w in listed] == ["online-worker"]
    [worker] = listed
    worker_id = str(Worker.objects.get(name="online-worker").id)
    assert worker["id"] == worker_id
    assert (worker["type"], worker["online"], worker["threads"], worker["max_length"]) == (
        "text",
        True,
        2,
        256,
    )
    assert (worker["models"], worker["maintenance_mode"], worker["trusted"]) == (["m1"], False, False)
    assert worker["team"] == {"name": None, "id": None}
    assert worker["performance"] == "No requests fulfilled yet"
    assert "owner" not in worker  # only to its owner and moderators
    assert requester.client.get("/api/v2/workers").json() == listed  # type defaults to all
    assert requester.client.get("/api/v2/workers?type=").json() == listed  # horde_sdk's "all"
    assert requester.client.get("/api/v2/workers?type=image").json() == []
    assert requester.client.get("/api/v2/workers?name=online-worker").json() == listed
    assert requester.client.get("/api/v2/workers?type=bogus").status_code == 400


def test_a_worker_is_found_by_id_or_name_online_or_not_and_its_owner_sees_more(requester, owner):
    owner.pop("findable", models=["m1"])
    worker = Worker.objects.get(name="findable")
    Worker.objects.filter(pk=worker.pk).update(last_pop_at=timezone.now() - timedelta(hours=1))
    by_id = requester.client.get(f"/api/v2/workers/{worker.id}").json()
    by_name = requester.client.get("/api/v2/workers/name/findable").json()
    assert by_id == by_name and by_id["online"] is False
    mine = owner.client.get(f"/api/v2/workers/{worker.id}", HTTP_APIKEY=owner.api_key).json()
    assert mine["owner"] == f"owner#{owner.account.id}"
    for path in ("/api/v2/workers/not-a-uuid", f"/api/v2/workers/{'0' * 8}-0000-0000-0000-{'0' * 12}",
                 "/api/v2/workers/name/nobody"):  # fmt: skip
        answer = requester.client.get(path)
        assert (answer.status_code, answer.json()["rc"]) == (404, "WorkerNotFound"), path


def test_a_workers_counters_follow_its_accepted_submits(requester, owner):
    TextModel.objects.create(name="m1", parameters=13_000_000_000)
    bridge = {"bridge_agent": "AI Horde Worker:1:https://example.org"}
    owner.pop("counted", models=["m1"], **bridge)
    requester.request_text(models=["m1"], params={"max_length": 40})
    job = owner.pop("counted", models=["m1"], **bridge).json()
    owner.submit(job["id"], "y" * 400)
    details = requester.client.get("/api/v2/workers/name/counted").json()
    # 40 tokens of a 13B model, a 20-token context: 40 x 13 / 125 x (1.2 + 2.2 ^ log2(20 / 1,024)).
    assert (details["requests_fulfilled"], details["tokens_generated"], details["kudos_rewards"]) == (
        1,
        40,
        5.04,
    )
    assert details["kudos_details"] == {"generated": 5.04, "uptime": 0}
    assert details["performance"].endswith(" tokens per second")


def test_the_owner_puts_its_worker_into_maintenance_and_out_again(requester, owner):
    owner.pop("flipped", models=["m1"])
    worker = Worker.objects.get(name="flipped")
    path = f"/api/v2/workers/{worker.id}"
    put = owner.client.put(path, {"maintenance": True}, format="json", HTTP_APIKEY=owner.api_key)
    assert (put.status_code, put.json()) == (200, {"maintenance": True})
    requester.request_text(models=["m1"])
    refused = owner.pop("flipped", models=["m1"])
    assert (refused.status_code, refused.json()["rc"]) == (403, "WorkerMaintenance")
    assert refused.json()["message"] == "This worker has been put into maintenance mode by its owner."
    back = owner.client.put(path, {"maintenance": False}, format="json", HTTP_APIKEY=owner.api_key)
    assert back.json() == {"maintenance": False}
    assert owner.pop("flipped", models=["m1"]).json()["id"] is not None


def test_only_the_owner_or_a_moderator_may_change_a_worker(requester, owner, make_caller):
    owner.pop("guarded", models=["m1"])
    path = f"/api/v2/workers/{Worker.objects.get(name='guarded').id}"
    stranger = requester.client.put(path, {"maintenance": True}, format="json", HTTP_APIKEY=requester.api_key)
    assert (stranger.status_code, stranger.json()["rc"]) == (403, "NotOwner")
    renamed = requester.client.put(path, {"name": "taken-over"}, format="json", HTTP_APIKEY=requester.api_key)
    assert (renamed.status_code, renamed.json()["rc"]) == (403, "NotModerator")
    assert owner.client.put(path, {"maintenance": True}, format="json").json()["rc"] == "InvalidAPIKey"
    moderator = make_caller("worker-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    body = {"maintenance": True, "maintenance_msg": "Checking your outputs."}
    assert moderator.client.put(path, body, format="json", HTTP_APIKEY=moderator.api_key).status_code == 200
    worker = Worker.objects.get(name="guarded")
    assert (worker.maintenance, worker.maintenance_reason) == (True, "Checking your outputs.")


def test_a_moderators_maintenance_binds_the_owner_until_a_moderator_lifts_it(owner, make_caller):
    owner.pop("bound", models=["m1"])
    worker = Worker.objects.get(name="bound")
    path = f"/api/v2/workers/{worker.id}"
    moderator = make_caller("binding-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    body = {"maintenance": True, "maintenance_msg": "Faked its model."}
    assert moderator.client.put(path, body, format="json", HTTP_APIKEY=moderator.api_key).status_code == 200
    Worker.objects.filter(pk=worker.pk).update(aborted_jobs=7)

    lifted = owner.client.put(path, {"maintenance": False}, format="json", HTTP_APIKEY=owner.api_key)
    assert (lifted.status_code, lifted.json()["rc"]) == (403, "NotModerator")
    assert "Faked its model." in lifted.json()["message"]
    refused = owner.pop("bound", models=["m1"])
    assert (refused.status_code, refused.json()["message"]) == (403, "Faked its model.")
    worker.refresh_from_db()
    assert (worker.maintenance, worker.maintenance_by_moderator, worker.aborted_jobs) == (True, True, 7)

    back = moderator.client.put(path, {"maintenance": False}, format="json", HTTP_APIKEY=moderator.api_key)
    assert back.status_code == 200
    assert (
        owner.client.put(path, {"maintenance": True}, format="json", HTTP_APIKEY=owner.api_key).status_code
        == 200
    )
    # The owner's own maintenance is the owner's to lift.
    assert (
        owner.client.put(path, {"maintenance": False}, format="json", HTTP_APIKEY=owner.api_key).status_code
        == 200
    )


def test_a_worker_a_moderator_paused_is_offered_nothing_until_a_moderator_unpauses_it(
    requester, owner, make_caller
):
    owner.pop("paused-one", models=["m1"])
    worker = Worker.objects.get(name="paused-one")
    path = f"/api/v2/workers/{worker.id}"
    moderator = make_caller("pausing-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    paused = moderator.client.put(path, {"paused": True}, format="json", HTTP_APIKEY=moderator.api_key)
    assert paused.json() == {"paused": True}
    requester.request_text(models=["m1"])

    empty = owner.pop("paused-one", models=["m1"])
    assert (empty.status_code, empty.json()["id"], empty.json()["skipped"]) == (200, None, {})
    seen = owner.client.get(f"/api/v2/workers/{worker.id}", HTTP_APIKEY=owner.api_key).json()
    assert seen["paused"] is True
    own = owner.client.get("/api/v2/workers?type=text", HTTP_APIKEY=owner.api_key).json()
    assert [w["paused"] for w in own if w["name"] == "paused-one"] == [True]
    unpaused = owner.client.put(path, {"paused": False}, format="json", HTTP_APIKEY=owner.api_key)
    assert (unpaused.status_code, unpaused.json()["rc"]) == (403, "NotModerator")

    moderator.client.put(path, {"paused": False}, format="json", HTTP_APIKEY=moderator.api_key)
    assert owner.pop("paused-one", models=["m1"]).json()["id"] is not None


def test_a_worker_takes_a_note_and_a_free_name_and_refuses_what_it_may_not_take(owner, make_caller):
    owner.pop("noted", models=["m1"])
    make_caller("other-owner").pop("taken-name")
    path = f"/api/v2/workers/{Worker.objects.get(name='noted').id}"

    def put(body):
        return owner.client.put(path, body, format="json", HTTP_APIKEY=owner.api_key)

    assert put({"info": "An RTX 4090 in a shed.", "name": "noted-again"}).json() == {
        "info": "An RTX 4090 in a shed.",
        "name": "noted-again",
    }
    assert owner.client.get("/api/v2/workers/name/noted-again").json()["info"] == "An RTX 4090 in a shed."
    assert put({"name": "taken-name"}).json()["rc"] == "WorkerNameAlreadyExists"
    assert put({}).json()["rc"] == "NoWorkerModSelected"
    no_team = put({"team": "some-team"})
    assert (no_team.status_code, no_team.json()["rc"]) == (404, "TeamNotFound")
    assert (put({"paused": True}).status_code, put({"paused": True}).json()["rc"]) == (403, "NotModerator")
    assert put({"name": "abc"}).json()["rc"] == "ValidationError"  # at least 5 characters
    assert put({"maintenance": "yes"}).json()["rc"] == "ValidationError"


def test_the_workers_list_is_rendered_once_for_every_caller_and_owners_see_their_own(
    requester, owner, make_caller
):
    from django.core.cache import cache

    from workers.details import ONLINE_LIST_KEY

    other = make_caller("other-owner")
    owner.pop("mine", models=["m1"])
    other.pop("theirs", models=["m1"])
    seen = {w["name"]: w for w in owner.client.get("/api/v2/workers", HTTP_APIKEY=owner.api_key).json()}
    assert seen["mine"]["owner"] == f"owner#{owner.account.id}"
    assert "owner" not in seen["theirs"]
    assert all("owner" not in w for w in requester.client.get("/api/v2/workers").json())
    # Cached for every caller (ONLINE_LIST_SECONDS): a change shows once the list is read again.
    Worker.objects.filter(name="mine").update(threads=7)
    assert {w["name"]: w["threads"] for w in requester.client.get("/api/v2/workers").json()}["mine"] == 1
    cache.delete(ONLINE_LIST_KEY)
    assert {w["name"]: w["threads"] for w in requester.client.get("/api/v2/workers").json()}["mine"] == 7


def test_a_horde_moderator_sees_every_workers_private_details_in_the_list(owner, make_caller):
    moderator = make_caller("horde-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    owner.pop("watched", models=["m1"])
    [listed] = moderator.client.get("/api/v2/workers", HTTP_APIKEY=moderator.api_key).json()
    assert listed["owner"] == f"owner#{owner.account.id}"


def test_the_owner_deletes_its_worker_and_its_name_makes_a_new_one_with_nothing_in_flight_lost(
    requester, owner
):
    owner.pop("doomed", models=["m1"])
    requester.request_text(models=["m1"])
    job = owner.pop("doomed", models=["m1"]).json()
    worker = Worker.objects.get(name="doomed")
    path = f"/api/v2/workers/{worker.id}"
    deleted = owner.client.delete(path, HTTP_APIKEY=owner.api_key)
    assert (deleted.status_code, deleted.json()) == (
        200,
        {"deleted_id": str(worker.id), "deleted_name": "doomed"},
    )
    assert requester.client.get(path).status_code == 404
    assert requester.client.get("/api/v2/workers/name/doomed").status_code == 404
    assert "doomed" not in [w["name"] for w in requester.client.get("/api/v2/workers").json()]
    assert requester.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key).json()["worker_ids"] == []
    # The job it held is still its to finish, and counts.
    assert owner.submit(job["id"], "finished after all").status_code == 200
    # Its name is free: the next pop under it makes a new worker.
    owner.pop("doomed", models=["m1"])
    fresh = Worker.objects.live().get(name="doomed")
    assert fresh.pk != worker.pk
    assert requester.client.get("/api/v2/workers/name/doomed").json()["id"] == str(fresh.pk)
    assert owner.client.delete(path, HTTP_APIKEY=owner.api_key).status_code == 404  # gone already


def test_only_the_owner_or_a_moderator_may_delete_a_worker(requester, owner, make_caller):
    owner.pop("kept", models=["m1"])
    worker = Worker.objects.get(name="kept")
    path = f"/api/v2/workers/{worker.id}"
    refused = requester.client.delete(path, HTTP_APIKEY=requester.api_key)
    assert (refused.status_code, refused.json()["rc"]) == (403, "NotModerator")
    assert requester.client.delete(path).status_code == 401
    assert requester.client.delete(path, HTTP_APIKEY="not-a-key").status_code == 401
    moderator = make_caller("a-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    assert moderator.client.delete(path, HTTP_APIKEY=moderator.api_key).status_code == 200
    assert Worker.objects.get(pk=worker.pk).deleted_at is not None
    assert requester.client.delete("/api/v2/workers/not-a-uuid", HTTP_APIKEY=owner.api_key).status_code == 404


def test_an_owner_cannot_shed_a_moderators_pause_or_maintenance_by_deleting_and_popping_again(
    requester, owner, make_caller
):
    moderator = make_caller("holding-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    holds = {
        "held-paused": {"paused": True},
        "held-bound": {"maintenance": True, "maintenance_msg": "Faked it."},
    }
    for name, hold in holds.items():
        owner.pop(name, models=["m1"])
        path = f"/api/v2/workers/{Worker.objects.get(name=name).id}"
        held = moderator.client.put(path, hold, format="json", HTTP_APIKEY=moderator.api_key)
        assert held.status_code == 200
        refused = owner.client.delete(path, HTTP_APIKEY=owner.api_key)
        assert (refused.status_code, refused.json()["rc"]) == (403, "NotModerator"), refused.content
        assert "only a moderator can delete it" in refused.json()["message"]
    assert Worker.objects.live().filter(name__in=holds).count() == 2
    requester.request_text(models=["m1"])
    # The same names pop the held rows, not clean ones: neither is offered the job.
    assert owner.pop("held-paused", models=["m1"]).json()["id"] is None
    assert owner.pop("held-bound", models=["m1"]).status_code == 403
    # The owner's own maintenance is no hold, and a moderator may still delete a held worker.
    owner.pop("own-maintenance", models=["m1"])
    mine = f"/api/v2/workers/{Worker.objects.get(name='own-maintenance').id}"
    owner.client.put(mine, {"maintenance": True}, format="json", HTTP_APIKEY=owner.api_key)
    assert owner.client.delete(mine, HTTP_APIKEY=owner.api_key).status_code == 200
    held = f"/api/v2/workers/{Worker.objects.get(name='held-paused').id}"
    assert moderator.client.delete(held, HTTP_APIKEY=moderator.api_key).status_code == 200


def test_an_untrusted_account_runs_three_workers_a_trusted_one_twenty_and_a_moderator_sets_more(
    owner, trusted_owner
):
    for n in range(3):
        assert owner.pop(f"mine-{n}").status_code == 200
    fourth = owner.pop("mine-3")
    assert (fourth.status_code, fourth.json()["rc"]) == (403, "TooManyWorkers")
    assert "up to 3 distinct workers" in fourth.json()["message"]
    assert owner.pop("mine-0").status_code == 200  # the ones it runs pop on

    for n in range(20):
        assert trusted_owner.pop(f"trusted-{n}").status_code == 200
    assert trusted_owner.pop("trusted-20").json()["rc"] == "TooManyWorkers"

    Account.objects.filter(pk=owner.account.pk).update(worker_limit=4)
    assert owner.pop("mine-3").status_code == 200
    # A deleted worker frees its place.
    deleted = Worker.objects.get(name="mine-3")
    owner.client.delete(f"/api/v2/workers/{deleted.id}", HTTP_APIKEY=owner.api_key)
    Account.objects.filter(pk=owner.account.pk).update(worker_limit=None)
    assert owner.pop("mine-4").json()["rc"] == "TooManyWorkers"
    owner.client.delete(f"/api/v2/workers/{Worker.objects.get(name='mine-2').id}", HTTP_APIKEY=owner.api_key)
    assert owner.pop("mine-4").status_code == 200


def _from(caller, address: str):
    caller.client.defaults["REMOTE_ADDR"] = address
    return caller


def test_untrusted_accounts_run_three_workers_from_one_address_whatever_the_account(make_caller):
    first, second, third = (_from(make_caller(), "203.0.113.7") for _ in range(3))
    assert first.pop("raid-1").status_code == 200
    assert first.pop("raid-2").status_code == 200
    assert second.pop("raid-3").status_code == 200
    refused = third.pop("raid-4")
    assert (refused.status_code, refused.json()["rc"]) == (403, "TooManySameIPs")
    assert Worker.objects.get(name="raid-1").address == "203.0.113.7"
    assert first.pop("raid-1").status_code == 200  # the ones that came first pop on

    # Another address has room; a trusted account's workers are not limited by address.
    assert _from(make_caller(), "198.51.100.1").pop("elsewhere").status_code == 200
    assert _from(make_caller(trusted=True), "203.0.113.7").pop("trusted-here").status_code == 200
    # A worker that moves to the address counts there from its next pop on.
    mover = _from(make_caller(), "198.51.100.2")
    mover.pop("mover")
    _from(mover, "203.0.113.7").pop("mover")
    assert Worker.objects.get(name="mover").address == "203.0.113.7"
    Worker.objects.filter(name__in=["raid-2", "raid-3"]).update(deleted_at=timezone.now())
    assert third.pop("raid-4").status_code == 200  # deleted ones free their places
    assert third.pop("raid-5").json()["rc"] == "TooManySameIPs"

    # A moderator's worker limit on the account lets it run that many from one address.
    Account.objects.filter(pk=third.account.pk).update(worker_limit=5)
    assert third.pop("raid-5").status_code == 200


def test_ipv6_workers_count_by_their_64_and_loopback_is_not_limited(make_caller, settings):
    for n in range(3):
        assert _from(make_caller(), f"2001:db8:1:2::{n + 1}").pop(f"v6-{n}").status_code == 200
    refused = _from(make_caller(), "2001:db8:1:2:ffff::9").pop("v6-same-64")
    assert refused.json()["rc"] == "TooManySameIPs"
    assert _from(make_caller(), "2001:db8:1:3::1").pop("v6-next-64").status_code == 200
    assert Worker.objects.get(name="v6-0").address == "2001:db8:1:2::/64"

    for n in range(4):
        assert _from(make_caller(), "127.0.0.1").pop(f"local-{n}").status_code == 200
    settings.WORKER_LIMIT_PER_ADDRESS = 0
    assert _from(make_caller(), "2001:db8:1:2::7").pop("limit-off").status_code == 200
