"""A moderator's steps that span the apps, each app's own step called in order."""

from datetime import datetime

from django.db.models import QuerySet

from jobs.services import cancel_account_requests
from workers import services as workers_services
from workers.models import Account


def suspend_accounts(*, accounts: QuerySet[Account], reason: str, now: datetime) -> list[Account]:
    """Suspend the accounts not yet suspended: their keys are refused everywhere from now on,
    with `reason` (`workers`), then their open requests are cancelled (`jobs`). Returns those
    suspended now."""
    suspended = workers_services.mark_suspended(accounts=accounts, reason=reason, now=now)
    for account in suspended:
        cancel_account_requests(account_id=account.pk, now=now)
    return suspended
