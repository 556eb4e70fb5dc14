"""What an account has been doing, as the accounts list shows it to moderators: its requests
and the tokens they were given in the last hour and day, and what its workers gave back and
left uncompleted. Annotations of an account queryset, each a subquery (no GROUP BY on the list:
its actions lock the rows), so that every column can be sorted. And, for the account page, the
tokens an account was given and served a day (`daily_tokens`).
"""

from datetime import date, datetime, timedelta

from django.conf import settings
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from jobs.models import Generation, TextRequest
from workers.models import Worker

HOUR, DAY = timedelta(hours=1), timedelta(days=1)


def _total(queryset: QuerySet, group: str, aggregate) -> Coalesce:
    per_account = queryset.order_by().values(group).annotate(total=aggregate).values("total")
    return Coalesce(Subquery(per_account, output_field=IntegerField()), 0)


def _requests_since(since: datetime) -> Coalesce:
    return _total(
        TextRequest.objects.filter(account=OuterRef("pk"), created_at__gte=since), "account", Count("*")
    )


def _tokens_since(since: datetime) -> Coalesce:
    # A generation finishes within its request's life: only requests that young can have one.
    lifetime = timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    generations = Generation.objects.filter(
        request__account=OuterRef("pk"),
        request__created_at__gte=since - lifetime,
        finished_at__gte=since,
        tokens__isnull=False,
    )
    return _total(generations, "request__account", Sum("tokens"))


def _workers_total(field: str) -> Coalesce:
    return _total(Worker.objects.filter(account=OuterRef("pk")), "account", Sum(field))


def with_activity(accounts: QuerySet, *, now: datetime) -> QuerySet:
    return accounts.annotate(
        requests_hour=_requests_since(now - HOUR),
        requests_day=_requests_since(now - DAY),
        tokens_hour=_tokens_since(now - HOUR),
        tokens_day=_tokens_since(now - DAY),
        given_back=_workers_total("given_back"),
        uncompleted=_workers_total("uncompleted_jobs"),
    )


def daily_tokens(*, account_id: int, since: datetime) -> tuple[dict[date, int], dict[date, int]]:
    """The tokens an account was given as a requester and its workers gave, each UTC day from
    `since` (the account page's chart)."""
    lifetime = timedelta(seconds=settings.TEXT_REQUEST_LIFETIME_SECONDS)
    requested = Generation.objects.filter(
        request__account_id=account_id, request__created_at__gte=since - lifetime
    ).tokens_per_day(since=since)
    served = Generation.objects.filter(worker__account_id=account_id).tokens_per_day(since=since)
    return requested, served
