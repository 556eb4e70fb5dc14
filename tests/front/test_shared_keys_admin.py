"""The shared keys in the admin (`front/admin/shared_keys.py`): moderators list and find them by
owner or id, read them and delete them, as the owner's deletion does; they change none."""

from datetime import timedelta
from decimal import Decimal

from django.contrib.admin.models import LogEntry
from rest_framework.test import APIClient

from hordeops import clock
from workers.models import SharedKey

LIST = "/admin/workers/sharedkey/"


def _keys(requester, make_caller):
    mine = SharedKey.objects.create(
        account=requester.account,
        name="Mutual Aid",
        kudos=Decimal("1234.50"),
        utilized=Decimal("65.50"),
        expiry=clock.now() + timedelta(days=3),
        max_text_tokens=300,
    )
    theirs = SharedKey.objects.create(account=make_caller("stranger").account, name="other bot", kudos=-1)
    return mine, theirs


def _row(key: SharedKey) -> str:
    return f'title="{key.pk}"'


def _listed(moderator, query: str = "") -> str:
    answer = moderator.get(LIST + query)
    assert answer.status_code == 200
    return answer.content.decode()


def test_the_list_shows_each_key_with_its_owner_linked_budget_use_expiry_and_cap(
    moderator, requester, make_caller
):
    mine, theirs = _keys(requester, make_caller)
    shown = _listed(moderator)
    row = shown.split(f'title="{mine.pk}"')[1].split("</tr>")[0]
    pk = requester.account.pk
    owner = f'<a href="/admin/workers/account/{pk}/change/">requester#{pk}</a>'
    assert "Mutual Aid" in row and owner in row
    assert "1,234.50" in row and "65.50" in row and ">300<" in row
    assert mine.expiry.strftime("%Y-%m-%d %H:%M") in row
    other = shown.split(f'title="{theirs.pk}"')[1].split("</tr>")[0]
    assert "unlimited" in other and "never" in other


def test_a_moderator_finds_keys_by_owner_name_and_by_the_whole_key(moderator, requester, make_caller):
    mine, theirs = _keys(requester, make_caller)
    by_owner = _listed(moderator, "?q=stranger")
    assert _row(theirs) in by_owner and _row(mine) not in by_owner
    by_key = _listed(
        moderator, f"?q={mine.pk}"
    )  # the search box shows it again: rows are told by their title
    assert _row(mine) in by_key and _row(theirs) not in by_key
    assert _row(mine) not in _listed(moderator, "?q=nobody-at-all")


def test_the_accounts_page_links_its_keys(moderator, requester, make_caller):
    mine, theirs = _keys(requester, make_caller)
    page = moderator.get(f"/admin/workers/account/{requester.account.pk}/change/").content.decode()
    link = f"/admin/workers/sharedkey/?account__id__exact={requester.account.pk}"
    assert f'<a href="{link}">its shared keys (1)</a>' in page
    listed = _listed(moderator, link.removeprefix(LIST))
    assert _row(mine) in listed and _row(theirs) not in listed


def test_a_moderator_reads_a_key_but_changes_nothing(moderator, requester, make_caller):
    mine, _ = _keys(requester, make_caller)
    page = f"{LIST}{mine.pk}/change/"
    assert moderator.get(page).status_code == 200
    answer = moderator.post(page, {"name": "renamed", "kudos": "-1", "max_text_tokens": "-1"})
    assert answer.status_code == 403
    mine.refresh_from_db()
    assert (mine.name, mine.kudos) == ("Mutual Aid", Decimal("1234.50"))
    assert moderator.get(f"{LIST}add/").status_code == 403


def test_a_key_a_moderator_deletes_is_refused_at_once_and_logged(moderator, requester, make_caller):
    mine, theirs = _keys(requester, make_caller)
    answer = moderator.post(LIST, {"action": "delete_selected", "_selected_action": [mine.pk], "post": "yes"})
    assert answer.status_code == 302
    assert list(SharedKey.objects.all()) == [theirs]
    used = APIClient().get("/api/v2/find_user", HTTP_APIKEY=str(mine.pk))
    assert used.status_code == 401 and used.json()["rc"] == "InvalidAPIKey"
    [entry] = LogEntry.objects.filter(object_id=str(mine.pk))
    assert entry.is_deletion() and entry.user.username == "mod"


def test_staff_outside_the_moderators_see_no_keys(plain_staff, requester, make_caller):
    _keys(requester, make_caller)
    assert plain_staff.get(LIST).status_code == 403


def test_the_list_runs_the_same_queries_however_many_keys(moderator, make_caller, django_assert_num_queries):
    for twice in range(2):
        for n in range(20):
            SharedKey.objects.create(account=make_caller(f"owner-{twice}-{n}").account)
        # The session, the user, its two reads of permissions, the count, the page of keys with
        # their owners joined.
        with django_assert_num_queries(6):
            assert moderator.get(LIST).status_code == 200
