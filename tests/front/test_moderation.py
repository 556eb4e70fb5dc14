"""The top floor: the admin site's models registered once, by it; a suspension that calls each
app's step in order, with no signal between them."""

import pytest
from django.contrib import admin

from front import moderation
from hordeops import clock
from jobs.models import TextRequest
from jobs.services import create_text_request
from workers.models import Account
from workers.services import create_account


def test_every_model_page_is_registered_by_the_front_app_once():
    registered = {model._meta.label: type(page).__module__ for model, page in admin.site._registry.items()}
    ours = {label: module for label, module in registered.items() if not label.startswith("auth.")}
    assert ours["workers.Account"] == "front.admin.accounts"
    assert {module.split(".")[0] for module in ours.values()} == {"front"}
    # The one Account page carries every app's part: its kudos, its activity, its suspicions.
    page = admin.site._registry[Account]
    assert {"kudos", "requests_hour_shown", "suspicion_count"} <= set(page.list_display)


@pytest.mark.django_db(transaction=True)
def test_a_suspension_marks_the_account_then_cancels_its_open_requests():
    now = clock.now()
    account, _ = create_account(name="flooder")
    other, _ = create_account(name="bystander")
    params = {"max_length": 80, "max_context_length": 1024}
    queued = [
        create_text_request(
            account=owner,
            prompt="hello",
            params=dict(params),
            models=[],
            workers=[],
            trusted_workers=False,
            slow_workers=True,
            dry_run=False,
            address="",
        ).request
        for owner in (account, account, other)
    ]

    suspended = moderation.suspend_accounts(
        accounts=Account.objects.filter(pk=account.pk), reason="Flooding.", now=now
    )

    assert [a.pk for a in suspended] == [account.pk]
    account.refresh_from_db()
    assert (account.suspended_at, account.suspension_reason) == (now, "Flooding.")
    states = {r.pk: TextRequest.objects.get(pk=r.pk).state for r in queued}
    assert states == {
        queued[0].pk: TextRequest.State.CANCELLED,
        queued[1].pk: TextRequest.State.CANCELLED,
        queued[2].pk: TextRequest.State.ACTIVE,
    }
    # Suspended already: a second suspension changes nothing and cancels nothing more.
    assert (
        moderation.suspend_accounts(accounts=Account.objects.filter(pk=account.pk), reason="Again.", now=now)
        == []
    )
