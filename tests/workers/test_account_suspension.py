"""Moderators suspend an account (its key refused everywhere with the reason, its open requests
cancelled) and reset a key, from the admin, each logged."""

from django.contrib.admin.models import LogEntry

from jobs.models import TextRequest
from tests.conftest import ACCOUNT_PAGE_INLINES
from workers.models import Account, Worker

ACCOUNTS = "/admin/workers/account/"
T0 = "2026-06-01 08:00:00+00:00"


def _refusal(answer) -> tuple[int, str]:
    return answer.status_code, answer.json()["rc"]


def test_a_suspended_accounts_key_is_refused_everywhere_and_its_open_requests_cancelled(
    moderator, requester, owner
):
    waiting = [requester.request_text().json()["id"] for _ in range(3)]
    moderator.post(
        ACCOUNTS,
        {"action": "suspend", "reason": "Seen flooding.", "_selected_action": [requester.account.pk]},
    )

    assert set(TextRequest.objects.filter(pk__in=waiting).values_list("state", flat=True)) == {"cancelled"}
    found = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key)
    assert _refusal(found) == (403, "AccountSuspended")
    assert "suspended by a moderator" in found.json()["message"]
    assert _refusal(requester.request_text()) == (403, "AccountSuspended")
    assert _refusal(requester.pop("its-worker")) == (403, "AccountSuspended")
    assert owner.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key).status_code == 200
    assert LogEntry.objects.filter(
        object_id=str(requester.account.pk), change_message__contains="Suspended"
    ).exists()

    moderator.post(
        ACCOUNTS,
        {"action": "lift_suspension", "reason": "Seen flooding.", "_selected_action": [requester.account.pk]},
    )
    assert requester.request_text().status_code == 202


def test_a_suspended_owners_worker_cannot_submit_what_it_holds_nor_stay_online(
    moderator, requester, owner, clock
):
    requester.request_text()
    job = owner.pop("held").json()
    moderator.post(
        ACCOUNTS, {"action": "suspend", "reason": "Seen flooding.", "_selected_action": [owner.account.pk]}
    )
    assert _refusal(owner.submit(job["id"], "The end.")) == (403, "AccountSuspended")
    seen = Worker.objects.get(name="held").last_pop_at
    clock.shift(600)
    assert _refusal(owner.pop("held")) == (403, "AccountSuspended")
    assert _refusal(owner.pop("another")) == (403, "AccountSuspended")
    assert Worker.objects.get(name="held").last_pop_at == seen  # its refused pops keep it nowhere
    assert not Worker.objects.filter(name="another").exists()


def test_a_reason_written_on_the_accounts_page_suspends_it_and_its_owner_reads_it(moderator, requester):
    page = f"{ACCOUNTS}{requester.account.pk}/change/"
    body = {**ACCOUNT_PAGE_INLINES, "trusted": "", "deadline_limit_ms": "", "max_waiting_requests": ""}
    moderator.post(page, {**body, "suspension_reason": "Flooding the queue from 40 keys."})
    account = Account.objects.get(pk=requester.account.pk)
    assert account.suspended_at is not None
    message = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).json()["message"]
    assert message.endswith("Flooding the queue from 40 keys.")

    moderator.post(page, {**body, "suspension_reason": ""})
    assert Account.objects.get(pk=account.pk).suspended_at is None
    assert requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).status_code == 200
    assert LogEntry.objects.filter(object_id=str(account.pk)).count() >= 2


def test_a_key_reset_refuses_the_old_key_and_shows_the_new_one_once(moderator, requester):
    answer = moderator.post(
        ACCOUNTS,
        {"action": "reset_key", "reason": "Seen flooding.", "_selected_action": [requester.account.pk]},
        follow=True,
    )
    shown = [str(m) for m in answer.context["messages"] if "New API key" in str(m)]
    assert len(shown) == 1
    new_key = shown[0].rsplit(" ", 1)[-1]
    old = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key)
    assert _refusal(old) == (401, "InvalidAPIKey")
    assert requester.client.get("/api/v2/find_user", HTTP_APIKEY=new_key).json()["id"] == requester.account.pk
    assert LogEntry.objects.filter(
        object_id=str(requester.account.pk), change_message__contains="reset"
    ).exists()
