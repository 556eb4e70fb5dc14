"""The moderators' admin: who sees what, the trust toggle and maintenance, all logged."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group

from jobs.models import Generation
from jobs.services import abort_stale_generations
from tests.conftest import ACCOUNT_PAGE_INLINES
from workers.models import Account, Worker
from workers.moderation import MODERATORS

PAGES = (
    "/admin/workers/account/",
    "/admin/workers/worker/",
    "/admin/jobs/textrequest/",
    "/admin/jobs/generation/",
)


@pytest.mark.parametrize("page", PAGES)
def test_a_moderator_sees_every_hordeops_list(moderator, owner, page):
    owner.pop("w")
    assert moderator.get(page).status_code == 200


@pytest.mark.parametrize("page", PAGES)
def test_staff_outside_the_moderators_see_nothing_of_hordeops(plain_staff, page):
    assert plain_staff.get(page).status_code == 403
    assert b"Accounts and workers" not in plain_staff.get("/admin/").content


def test_the_trust_action_changes_the_cap_of_the_next_pop_and_is_logged(moderator, owner, requester):
    owner.pop("w", chat=True)
    requester.request_text(models=["m1"])
    answer = moderator.post(
        "/admin/workers/account/", {"action": "trust", "_selected_action": [owner.account.pk]}, follow=True
    )
    assert answer.status_code == 200
    assert Account.objects.get(pk=owner.account.pk).trusted is True
    assert owner.pop("w", chat=True).json()["lease"]["cap_seconds"] == 600
    [entry] = LogEntry.objects.filter(object_id=str(owner.account.pk))
    assert entry.user.username == "mod"
    assert "Trusted" in entry.get_change_message()
    moderator.post("/admin/workers/account/", {"action": "untrust", "_selected_action": [owner.account.pk]})
    assert Account.objects.get(pk=owner.account.pk).trusted is False
    assert LogEntry.objects.filter(object_id=str(owner.account.pk)).count() == 2


def test_a_moderator_changes_only_trust_the_deadline_limit_and_the_waiting_bound(moderator, owner):
    page = f"/admin/workers/account/{owner.account.pk}/change/"
    moderator.post(
        page,
        {
            **ACCOUNT_PAGE_INLINES,
            "name": "renamed",
            "trusted": "on",
            "deadline_limit_ms": "5000",
            "max_waiting_requests": "100",
        },
    )
    account = Account.objects.get(pk=owner.account.pk)
    assert (account.name, account.trusted, account.deadline_limit_ms) == ("owner", True, 5000)
    assert (account.max_waiting_requests, account.waiting_requests_limit) == (100, 100)
    assert moderator.get("/admin/workers/account/add/").status_code == 403
    # Emptied, the account is back on the horde's default, and the list says so.
    moderator.post(
        page,
        {**ACCOUNT_PAGE_INLINES, "trusted": "on", "deadline_limit_ms": "5000", "max_waiting_requests": ""},
    )
    account.refresh_from_db()
    assert (account.max_waiting_requests, account.waiting_requests_limit) == (None, 30)
    assert "30 (default)" in moderator.get("/admin/workers/account/").content.decode()


def test_maintenance_actions_enter_and_leave_with_a_reason_and_a_log(moderator, owner):
    owner.pop("w")
    worker = Worker.objects.get(name="w")
    moderator.post(
        "/admin/workers/worker/",
        {"action": "enter_maintenance", "reason": "Seen flooding.", "_selected_action": [worker.pk]},
    )
    worker.refresh_from_db()
    assert (worker.maintenance, worker.maintenance_reason) == (True, "Seen flooding.")
    assert owner.pop("w").status_code == 403  # WorkerMaintenance: nothing of its own waits
    moderator.post(
        "/admin/workers/worker/",
        {"action": "leave_maintenance", "reason": "Seen flooding.", "_selected_action": [worker.pk]},
    )
    worker.refresh_from_db()
    assert (worker.maintenance, worker.maintenance_reason) == (False, "")
    assert LogEntry.objects.filter(object_id=str(worker.pk)).count() == 2


def test_maintenance_from_a_list_filtered_by_maintenance_is_logged_and_binds(moderator, owner):
    owner.pop("w1")
    owner.pop("w2")
    workers = list(Worker.objects.filter(name__in=["w1", "w2"]))
    selected = [worker.pk for worker in workers]
    moderator.post(
        "/admin/workers/worker/?maintenance__exact=0",
        {"action": "enter_maintenance", "reason": "Seen flooding.", "_selected_action": selected},
    )
    moderator.post(
        "/admin/workers/worker/?maintenance__exact=1",
        {"action": "leave_maintenance", "reason": "Seen flooding.", "_selected_action": selected},
    )
    moderator.post(
        "/admin/workers/worker/?maintenance__exact=0",
        {"action": "enter_maintenance", "reason": "Seen flooding.", "_selected_action": selected},
    )
    for worker in workers:
        assert LogEntry.objects.filter(object_id=str(worker.pk)).count() == 3
    path = f"/api/v2/workers/{workers[0].pk}"
    lifted = owner.client.put(path, {"maintenance": False}, format="json", HTTP_APIKEY=owner.api_key)
    assert (lifted.status_code, lifted.json()["rc"]) == (403, "NotModerator")


def test_the_worker_list_shows_unmeasured_speed_and_capacity(moderator, owner):
    owner.pop("fresh", chat=True)
    html = moderator.get("/admin/workers/worker/").content.decode()
    assert "unmeasured" in html
    assert "1200" in html  # 10 tokens/s x (150 - 30) s


def test_the_migration_made_the_moderators_group_with_its_permissions(db):
    group = Group.objects.get(name=MODERATORS)
    assert sorted(group.permissions.values_list("codename", flat=True)) == [
        "add_addresstimeout",
        "add_newspiece",
        "add_textmodel",
        "add_workermessage",
        "award_kudos",
        "cancel_textrequest",
        "change_account",
        "change_addresstimeout",
        "change_hordemodes",
        "change_newspiece",
        "change_style",
        "change_stylecollection",
        "change_team",
        "change_textmodel",
        "change_worker",
        "change_workermessage",
        "delete_addresstimeout",
        "delete_newspiece",
        "delete_sharedkey",
        "delete_style",
        "delete_stylecollection",
        "delete_team",
        "delete_textmodel",
        "delete_workermessage",
        "view_account",
        "view_addresstimeout",
        "view_generation",
        "view_hordedocument",
        "view_hordemodes",
        "view_newspiece",
        "view_posting",
        "view_sharedkey",
        "view_style",
        "view_stylecollection",
        "view_suspicion",
        "view_team",
        "view_textmodel",
        "view_textrequest",
        "view_worker",
        "view_workermessage",
    ]


def test_the_generation_list_shows_live_leases_and_filters_live_lapsed_and_aborted(
    moderator, owner, requester, time_machine
):
    time_machine.move_to("2026-08-01 12:00:00+00:00", tick=False)
    owner.pop("w")
    ids = []
    for _ in range(3):
        requester.request_text(models=["m1"])
        ids.append(owner.pop("w").json()["id"])
        time_machine.shift(100)
    # Popped at 0, 100 and 200 s; now 300 s: the first is aborted, the second lapsed, the third live.
    abort_stale_generations(now=Generation.objects.get(pk=ids[0]).popped_at + timedelta(seconds=151))
    page = moderator.get("/admin/jobs/generation/").content.decode()
    assert "Left (s)" in page and ">50<" in page  # the live one: 200 + 150 - 300
    for lease, expected in (("live", ids[2]), ("lapsed", ids[1]), ("aborted", ids[0])):
        html = moderator.get(f"/admin/jobs/generation/?lease={lease}").content.decode()
        assert expected in html, lease
        assert all(other not in html for other in ids if other != expected), lease


def test_a_binding_list_action_asks_for_a_reason_first_and_logs_it(moderator, owner):
    owner.pop("w")
    worker = Worker.objects.get(name="w")
    asked = moderator.post("/admin/workers/worker/", {"action": "pause", "_selected_action": [worker.pk]})
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Pause workers" in page and 'name="reason"' in page and ">w<" in page
    assert Worker.objects.get(pk=worker.pk).paused is False  # nothing done yet
    empty = moderator.post(
        "/admin/workers/worker/", {"action": "pause", "reason": "", "_selected_action": [worker.pk]}
    )
    assert "This field is required." in empty.content.decode()
    assert Worker.objects.get(pk=worker.pk).paused is False

    done = moderator.post(
        "/admin/workers/worker/",
        {"action": "pause", "reason": "Replies are gibberish.", "_selected_action": [worker.pk]},
    )
    assert done.status_code == 302
    assert Worker.objects.get(pk=worker.pk).paused is True
    [entry] = LogEntry.objects.filter(object_id=str(worker.pk))
    assert (
        entry.change_message
        == "Paused (offered no jobs until a moderator unpauses it): Replies are gibberish."
    )


def test_the_flag_action_stops_an_accounts_workers_with_a_reason_and_a_log(moderator, owner):
    moderator.post(
        "/admin/workers/account/",
        {"action": "flag", "reason": "Fake replies.", "_selected_action": [owner.account.pk]},
    )
    assert Account.objects.get(pk=owner.account.pk).flagged_at is not None
    [entry] = LogEntry.objects.filter(object_id=str(owner.account.pk))
    assert (
        entry.change_message
        == "Flagged (its workers offered no jobs until its suspicions are cleared): Fake replies."
    )
    moderator.post(
        "/admin/workers/account/",
        {"action": "clear_suspicion", "reason": "Sorted out.", "_selected_action": [owner.account.pk]},
    )
    assert Account.objects.get(pk=owner.account.pk).flagged_at is None  # a flag alone is cleared too
