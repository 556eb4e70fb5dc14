"""Accounts as the AI Horde's `find_user` and `users/{id}` show a user (`horde/apis/models/v2.py`
`UserDetails`): its kudos and its records from its spendable wallet, kept by the ledger.

`privileged` is the AI Horde's details privilege: the caller is the account itself or a
moderator; `moderator` the higher one, a moderator's, which also sees the escrow.
"""

from datetime import datetime
from decimal import Decimal
from typing import Any

from kudos.models import Wallet
from workers import styles
from workers.details import unique_alias
from workers.models import Account

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
    account: Account, *, now: datetime, privileged: bool, moderator: bool = False
) -> dict[str, Any]:
    workers = list(account.workers.live())  # as many as the account runs
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
        "worker_invited": 0,
        "moderator": account.moderator,
        "trusted": account.trusted,
        "flagged": False,
        "pseudonymous": account.is_anonymous or account.pseudonymous,
        "worker_count": len(workers),
        "account_age": max(0, int((now - account.created_at).total_seconds())),
        "service": False,
        "deleted": False,
        "education": False,
        "customizer": account.customizer,
        "styles": styles.account_styles(account, privileged=privileged),
    }
    if privileged:
        details.update(
            worker_ids=[str(worker.pk) for worker in workers],
            sharedkey_ids=[str(key) for key in account.shared_keys.values_list("pk", flat=True)],
            vpn=False,
            special=False,
        )
    if moderator:
        details["evaluating_kudos"] = _number(wallets.get(True, (Decimal(0), {}))[0])
    return details
