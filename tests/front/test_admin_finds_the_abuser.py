"""The admin that finds the abuser: accounts by their activity, requests by account, model,
state and age with a bulk cancel, and the queue broken down on the operations page."""

import re
from datetime import timedelta

from django.contrib.admin.models import LogEntry

from jobs.models import TextRequest
from workers.models import Worker

T0 = "2026-06-01 12:00:00+00:00"
REQUESTS = "/admin/jobs/textrequest/"


def _ids(page) -> list[str]:
    return re.findall(r'<span title="([0-9a-f-]{36})">', page.content.decode())


def test_requests_are_found_by_account_model_state_and_age_and_cancelled_in_bulk(
    clock, moderator, make_caller
):
    spammer, other = make_caller("spammer"), make_caller("quiet-one")
    old = spammer.request_text(models=["old-model"]).json()["id"]
    clock.shift(timedelta(hours=2))
    flood = [spammer.request_text(models=["flood-model"]).json()["id"] for _ in range(4)]
    mine = other.request_text(models=["flood-model"]).json()["id"]
    anything = other.request_text().json()["id"]

    assert sorted(_ids(moderator.get(REQUESTS, {"q": "spammer"}))) == sorted([old, *flood])
    assert sorted(_ids(moderator.get(REQUESTS, {"model": "flood-model"}))) == sorted([*flood, mine])
    assert _ids(moderator.get(REQUESTS, {"model": "any"})) == [anything]
    assert old not in _ids(moderator.get(REQUESTS, {"age": "1h"}))
    assert _ids(moderator.get(REQUESTS, {"age": "1h", "q": "spammer", "model": "old-model"})) == []
    assert _ids(moderator.get(REQUESTS, {"age": "1d", "q": "spammer", "model": "old-model"})) == [old]
    by_account = moderator.get(REQUESTS, {"account__id__exact": spammer.account.pk})
    assert sorted(_ids(by_account)) == sorted([old, *flood])
    assert b"flood-model" in moderator.get(REQUESTS).content  # offered as a filter

    answer = moderator.post(
        f"{REQUESTS}?q=spammer&state__exact=active",
        {"action": "cancel", "reason": "Seen flooding.", "_selected_action": [*flood, old]},
    )
    assert answer.status_code == 302
    states = {str(pk): state for pk, state in TextRequest.objects.values_list("id", "state")}
    assert [states[pk] for pk in flood] == ["cancelled"] * 4
    assert states[old] == "expired"  # past its life: the cancellation expires it, as the stale pass would
    assert states[mine] == "active"
    assert spammer.status(flood[0]).json()["faulted"] is False  # the requester sees it ended
    assert LogEntry.objects.filter(change_message="Cancelled by a moderator: Seen flooding.").count() == 5


def test_the_accounts_list_shows_each_accounts_activity_and_sorts_by_it(clock, moderator, make_caller, owner):
    busy = make_caller("busy-one")
    make_caller("idle-one")
    busy.request_text()
    clock.shift(timedelta(hours=3))
    for _ in range(3):
        busy.request_text()
    job = owner.pop("giver").json()
    owner.submit(job["id"], "", state="faulted")
    job = owner.pop("giver").json()
    owner.submit(job["id"], "x" * 200)  # 50 tokens
    clock.shift(timedelta(minutes=1))
    page = moderator.get("/admin/workers/account/", {"o": "-6"}).content.decode()  # requests 1 h, most first
    rows = re.findall(r"<tr>.*?</tr>", page, flags=re.S)
    names = [
        re.search(r"field-name[^>]*>(?:<a [^>]*>)?([^<]+)", row).group(1)
        for row in rows
        if "field-name" in row
    ]
    assert names[0] == "busy-one"
    busy_row = next(row for row in rows if "busy-one" in row)
    cells = dict(re.findall(r'class="field-([a-z_]+)[^"]*">(?:<a [^>]*>)?([^<]*)', busy_row))
    assert (cells["requests_hour_shown"], cells["requests_day_shown"], cells["tokens_hour_shown"]) == (
        "3",
        "4",
        "50",
    )
    owner_row = next(row for row in rows if ">owner<" in row)
    owner_cells = dict(re.findall(r'class="field-([a-z_]+)[^"]*">(?:<a [^>]*>)?([^<]*)', owner_row))
    assert (owner_cells["given_back_shown"], owner_cells["uncompleted_shown"]) == ("1", "1")
    assert "idle-one" in page


def test_the_operations_page_breaks_the_queue_down_by_account_model_and_age(clock, moderator, make_caller):
    spammer, other = make_caller("spammer"), make_caller("quiet-one")
    for _ in range(3):
        spammer.request_text(models=["flood-model"])
    clock.shift(timedelta(minutes=10))
    other.request_text()
    page = moderator.get("/admin/operations/").content.decode()
    breakdown = page[page.index('id="ops-queue-breakdown"') :]
    share = r'<tr class="ops-share">\s*<th scope="row"><a href="[^"]*">([^<]+)</a></th>'
    rows = re.findall(share + r"\s*<td>(\d+)</td>\s*<td>(\d+)</td>", breakdown)
    assert rows[:2] == [("spammer", "3", "600"), ("quiet-one", "1", "0")]
    assert ("flood-model", "3", "600") in rows and ("(any model)", "1", "0") in rows
    assert ("under a minute", "1", "0") in rows and ("5 to 20 minutes", "3", "600") in rows
    assert Worker.objects.count() == 0
