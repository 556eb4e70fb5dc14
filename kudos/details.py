"""Accounts as the AI Horde's `find_user` and `users/{id}` show a user (`horde/apis/models/v2.py`
`UserDetails`): its kudos and its records from its spendable wallet, kept by the ledger.

`privileged` is the AI Horde's details privilege: the caller is the account itself or a
moderator; `moderator` the higher one, a moderator's, which also sees the escrow.
"""

import struct
from datetime import datetime
from decimal import Decimal
from typing import Any

import redis.exceptions
from django.db import connection
from django.db.models import Subquery
from django_redis import get_redis_connection

from kudos import sql
from kudos.models import Wallet
from workers import styles
from workers.details import unique_alias
from workers.models import Account, Worker

# The AI Horde's `kudos_details` keys, each shown, 0 where nothing moved.
DETAILS_KEYS = ("accumulated", "gifted", "donated", "admin", "received", "recurring", "awarded", "styled")


def _number(value: Decimal | str | float) -> float:
    return round(float(value), 2)


def records(details: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The AI Horde's `UserRecords` from a wallet's `details` (its events' `records`)."""

    def kept(key: str) -> int:
        return int(Decimal(str(details.get(key, 0))))

    return {
        "usage": {"megapixelsteps": 0, "tokens": kept("usage_tokens")},
        "contribution": {"megapixelsteps": 0, "tokens": kept("contribution_tokens")},
        "fulfillment": {"image": 0, "text": kept("fulfillment_text"), "interrogation": 0},
        "request": {"image": 0, "text": kept("request_text"), "interrogation": 0},
        "style": {"image": 0, "text": kept("style_text"), "interrogation": 0},
    }


def user_details(
    account: Account,
    *,
    now: datetime,
    privileged: bool,
    moderator: bool = False,
    worker_ids: list[str] | None = None,
    wallets: dict[bool, tuple[Decimal, dict]] | None = None,
    style_rows: list[tuple[Any, str]] | None = None,
) -> dict[str, Any]:
    """`worker_ids`, `wallets` (by escrow: balance and details) and `style_rows` as read for
    many accounts at once (`users_page`); read here when not given."""
    if worker_ids is None:  # as many as the account runs
        worker_ids = [str(pk) for pk in account.workers.live().values_list("pk", flat=True)]
    if wallets is None:
        wallets = {
            escrow: (balance, details)
            for escrow, balance, details in Wallet.objects.filter(account=account).values_list(
                "escrow", "balance", "details"
            )
        }
    balance, moved = wallets.get(False, (Decimal(0), {}))
    details: dict[str, Any] = {
        "username": unique_alias(account),
        "id": account.pk,
        "kudos": _number(balance),
        "kudos_details": {key: _number(moved.get(key, 0)) for key in DETAILS_KEYS},
        "usage": {},  # the AI Horde's obsolete keys, empty there too
        "contributions": {},
        "records": records(moved),
        "concurrency": account.waiting_requests_limit,
        # The AI Horde's invitation is hordeops' worker limit a moderator set (0: none set).
        "worker_invited": account.worker_limit or 0,
        "moderator": account.moderator,
        "trusted": account.trusted,
        "flagged": account.flagged_at is not None,
        "pseudonymous": account.is_anonymous or account.pseudonymous,
        "worker_count": len(worker_ids),
        "account_age": max(0, int((now - account.created_at).total_seconds())),
        "service": account.service,
        "deleted": False,
        "education": False,
        "customizer": account.customizer,
        "styles": styles.account_styles(account, privileged=privileged, rows=style_rows),
    }
    if privileged or account.public_workers:
        details["worker_ids"] = worker_ids
    if privileged:
        details.update(
            sharedkey_ids=[str(key) for key in account.shared_keys.values_list("pk", flat=True)],
            vpn=False,
            special=False,
        )
        if account.contact:
            details["contact"] = account.contact
    if moderator:
        details["evaluating_kudos"] = _number(wallets.get(True, (Decimal(0), {}))[0])
        if account.admin_comment:
            details["admin_comment"] = account.admin_comment
    return details


# The AI Horde's page of users, and the last page it answers (past it: an empty list).
USERS_PER_PAGE = 25
LAST_USERS_PAGE = 10000
USER_SORTS = ("kudos", "age")
# How long the order by kudos is kept (the AI Horde keeps each page 300 s): the kudos shown are
# read afresh, only who comes first is that old.
RANKING_SECONDS = 300
RANKING_KEY = "hordeops:users:by-kudos"
ID_BYTES = 8


def _by_kudos() -> list[int]:
    """Every account id in the order by kudos (`sql.ACCOUNTS_BY_KUDOS`): one row, one array."""
    with connection.cursor() as cursor:
        cursor.execute(sql.ACCOUNTS_BY_KUDOS)
        (ids,) = cursor.fetchone()
    return ids or []


def _ranked(start: int, stop: int) -> list[int]:
    """Ids `start` to `stop` of the order by kudos, from the copy kept in Redis for
    RANKING_SECONDS (8 bytes an id: a page reads its 200), made anew when it is missing, and
    read from the database alone without Redis."""
    try:
        client = get_redis_connection("default")
        packed = client.getrange(RANKING_KEY, start * ID_BYTES, stop * ID_BYTES - 1)
        if packed or client.exists(RANKING_KEY):
            return list(struct.unpack(f">{len(packed) // ID_BYTES}q", packed))
        ranking = _by_kudos()
        client.set(RANKING_KEY, struct.pack(f">{len(ranking)}q", *ranking), ex=RANKING_SECONDS)
        return ranking[start:stop]
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return _by_kudos()[start:stop]


def users_page(*, sort: str, page: int, now: datetime) -> list[dict[str, Any]]:
    """A page of every account as anyone sees it (the AI Horde's `Users`): by spendable kudos,
    most first (the order kept for RANKING_SECONDS), or by `age`, oldest first (any other
    `sort` is `kudos`, as there); four statements, five when the order by kudos is made."""
    if page > LAST_USERS_PAGE:
        return []
    start = (max(page, 1) - 1) * USERS_PER_PAGE
    stop = start + USERS_PER_PAGE
    if sort == "age":
        # The page's ids alone walk the index (`account_by_age`); then their rows.
        page_ids = Account.objects.order_by("created_at", "id").values("id")[start:stop]
        accounts = list(Account.objects.filter(pk__in=Subquery(page_ids)).order_by("created_at", "id"))
    else:
        ids = _ranked(start, stop)
        found = Account.objects.in_bulk(ids)
        accounts = [found[account_id] for account_id in ids if account_id in found]
    ids = [account.pk for account in accounts]
    workers: dict[int, list[str]] = {pk: [] for pk in ids}
    for account_id, worker_id in (
        Worker.objects.live().filter(account_id__in=ids).order_by("name").values_list("account_id", "pk")
    ):
        workers[account_id].append(str(worker_id))
    wallets: dict[int, dict[bool, tuple[Decimal, dict]]] = {pk: {} for pk in ids}
    for account_id, escrow, kept, moved in Wallet.objects.filter(account_id__in=ids).values_list(
        "account_id", "escrow", "balance", "details"
    ):
        wallets[account_id][escrow] = (kept, moved)
    public = styles.public_styles_of(ids)
    return [
        user_details(
            account,
            now=now,
            privileged=False,
            worker_ids=workers[account.pk],
            wallets=wallets[account.pk],
            style_rows=public[account.pk],
        )
        for account in accounts
    ]
