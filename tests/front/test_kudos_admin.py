"""The kudos admin: awards by moderators (logged, with a reason), the ledger by account and kind,
an account's kudos and the model table."""

from decimal import Decimal

from django.contrib.admin.models import LogEntry

from kudos import ledger, sizes
from kudos.models import Event
from tests.conftest import give_kudos


def test_a_moderator_awards_kudos_with_a_reason_posted_and_logged(moderator, owner):
    page = f"/admin/workers/account/{owner.account.pk}/award/"
    assert moderator.get(page).status_code == 200
    answer = moderator.post(page, {"amount": "120.50", "reason": "ran the event worker"})
    assert answer.status_code == 302
    assert ledger.balance(owner.account.pk) == Decimal("120.50")
    event = Event.objects.get(kind=Event.Kind.AWARD)
    assert event.reason == "ran the event worker (by mod)"
    entry = LogEntry.objects.get(object_id=str(owner.account.pk))
    assert "Awarded 120.50 kudos: ran the event worker" in entry.get_change_message()


def test_an_award_needs_a_positive_amount_and_a_reason(moderator, owner):
    page = f"/admin/workers/account/{owner.account.pk}/award/"
    for body in (
        {"amount": "0", "reason": "x"},
        {"amount": "-5", "reason": "x"},
        {"amount": "5", "reason": ""},
    ):
        assert moderator.post(page, body).status_code == 200  # the form again, with its error
    assert not Event.objects.exists()


def test_staff_without_the_permission_cannot_award(plain_staff, owner):
    assert plain_staff.get(f"/admin/workers/account/{owner.account.pk}/award/").status_code == 403


def test_the_ledger_lists_an_accounts_postings_newest_first_and_by_kind(moderator, owner, requester):
    give_kudos(owner, "100")
    give_kudos(requester, "100")
    requester.request_text()  # the horde tax
    page = moderator.get(f"/admin/kudos/posting/?wallet__account__id__exact={requester.account.pk}")
    assert page.status_code == 200
    rows = page.context["cl"].result_list
    assert [row.event.kind for row in rows] == [Event.Kind.TAX, Event.Kind.AWARD]
    assert {row.wallet.account_id for row in rows} == {requester.account.pk}
    by_kind = moderator.get("/admin/kudos/posting/?event__kind__exact=award").context["cl"].result_list
    assert {row.event.kind for row in by_kind} == {Event.Kind.AWARD} and len(by_kind) == 4
    assert moderator.post(f"/admin/kudos/posting/{rows[0].pk}/delete/").status_code == 403


def test_an_accounts_page_shows_its_kudos_escrow_reservations_and_ledger(moderator, owner):
    give_kudos(owner, "75")
    page = moderator.get(f"/admin/workers/account/{owner.account.pk}/change/").content.decode()
    assert "75.00" in page
    assert f"?account__id__exact={owner.account.pk}&state__exact=active" in page
    assert f"?wallet__account__id__exact={owner.account.pk}" in page
    listing = moderator.get("/admin/workers/account/?o=5").content.decode()  # sortable by kudos
    assert "75.00" in listing


def test_moderators_keep_the_model_table(moderator):
    assert sizes.billions("koboldcpp/NewModel-20B") is None
    answer = moderator.post(
        "/admin/kudos/textmodel/add/", {"name": "koboldcpp/NewModel-20B", "parameters": 20_000_000_000}
    )
    assert answer.status_code == 302
    assert sizes.billions("koboldcpp/NewModel-20B") == 20
