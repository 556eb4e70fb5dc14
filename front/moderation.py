"""A moderator's steps on accounts and on the horde, each app's own step called in order, with the
words the admin's history logs them by: the admin's actions and the horde API's moderator routes
(`front/moderator_routes.py`) take the same steps and log them alike."""

import logging
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils.text import capfirst

from front.api_log import log_api_act
from front.signup import NAME_MAX_CHARS
from hordeops import clock, errors
from hordeops.parsing import ascii_int
from jobs.services import cancel_account_requests
from kudos import awards, ledger
from workers import modes, proxies, suspicion
from workers import services as workers_services
from workers.details import unique_alias
from workers.models import ANONYMOUS_API_KEY_HASH, Account, HordeModes

logger = logging.getLogger(__name__)

# What the admin's history says of each act, in the admin and through the API alike (the API's
# entries add "through the API by alice#3").
TRUST_WORDS = {
    True: "Trusted (their workers' next pops get the matching lease cap)",
    False: "Untrusted (their workers' next pops get the matching lease cap)",
}
FLAGGED = "Flagged (its workers offered no jobs until its suspicions are cleared)"
SUSPICIONS_CLEARED = "Suspicions cleared (its workers offered jobs again)"
PASSKEY_MADE = "Proxy passkey made (any older one no longer works)"


def awarded(amount: Decimal | int) -> str:
    return f"Awarded {amount} kudos"


def changed(model, *fields: str) -> str:
    """The admin's change form's words for these fields: "Changed Max waiting requests"."""
    labels = [str(capfirst(model._meta.get_field(name).verbose_name)) for name in fields]
    return f"Changed {' and '.join(labels)}"


def suspend_accounts(*, accounts: QuerySet[Account], reason: str, now: datetime) -> list[Account]:
    """Suspend the accounts not yet suspended: their keys are refused everywhere from now on,
    with `reason` (`workers`), then their open requests are cancelled (`jobs`). Returns those
    suspended now."""
    suspended = workers_services.mark_suspended(accounts=accounts, reason=reason, now=now)
    for account in suspended:
        cancel_account_requests(account_id=account.pk, now=now)
    return suspended


def trust_accounts(*, accounts: QuerySet[Account], trusted: bool) -> list[Account]:
    """Trust or untrust the accounts; return those changed. The anonymous account is never
    trusted, as on the AI Horde."""
    changing = list(accounts.exclude(trusted=trusted).exclude(api_key_hash=ANONYMOUS_API_KEY_HASH))
    these = Account.objects.filter(pk__in=[account.pk for account in changing])
    workers_services.set_trust(accounts=these, trusted=trusted)
    return changing


def clear_suspicions(*, accounts: QuerySet[Account]) -> list[Account]:
    """Forget the accounts' suspicions and lift their flag; return those that had either."""
    clearing = list(accounts.filter(Q(suspicions__isnull=False) | Q(flagged_at__isnull=False)).distinct())
    suspicion.clear(accounts=accounts)
    return clearing


# -- The horde API's moderator routes -----------------------------------------------------------

# PUT /api/v2/users/{id}: a moderator's fields, and the account's own (which a moderator may set too).
MODERATOR_FIELDS = (
    "kudos",
    "concurrency",
    "worker_invited",
    "trusted",
    "flagged",
    "reset_suspicion",
    "admin_comment",
    "customizer",
)
OWN_FIELDS = ("public_workers", "username", "contact", "generate_proxy_passkey", "undelete")
# The fields that are the account's columns (`Account`): the AI Horde's invitation to run workers
# is hordeops' worker limit, its concurrency the bound of waiting requests.
COLUMNS = (
    ("concurrency", "max_waiting_requests"),
    ("worker_invited", "worker_limit"),
    ("admin_comment", "admin_comment"),
    ("customizer", "customizer"),
    ("public_workers", "public_workers"),
    ("username", "name"),
    ("contact", "contact"),
)


def find_account(user_id: str) -> Account:
    number = ascii_int(user_id)
    account = Account.objects.filter(pk=number).first() if number is not None else None
    if account is None:
        raise errors.UserNotFound(f"User with ID '{user_id[:40]}' not found.")
    return account


def _may_modify(caller: Account, account: Account, changes: dict[str, Any]) -> None:
    """The AI Horde's rules of who may set what, checked for every field before any is set
    (the AI Horde sets each as it goes, so a refusal there can leave some set)."""
    if changes.get("moderator") is not None:
        raise errors.NotAdmin("Only the horde's operator makes moderators, in the admin.")
    if any(field in changes for field in MODERATOR_FIELDS) and not caller.moderator:
        raise errors.NotModerator("Only a moderator may change this of an account.")
    if any(field in changes for field in OWN_FIELDS):
        if not caller.moderator and caller.pk != account.pk:
            raise errors.NotModerator("Only the account itself or a moderator may change this.")
        if caller.is_anonymous:
            raise errors.AnonForbiddenUserMod()
    if changes.get("generate_proxy_passkey") and not account.service:
        raise errors.NonServiceForbidden()  # a passkey is a service account's ("Service accounts")
    if "undelete" in changes:
        raise errors.UserNotDeleted()


def modify_user(*, caller: Account, user_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """`PUT /api/v2/users/{id}`: set what `changes` gives (`kudos` a positive whole number,
    awarded; the rest as `front/moderator_routes.py` `ModifyUserInput` reads them); return the
    AI Horde's `ModifyUser`, what was set. A moderator's every change is logged in the admin's
    history as the admin's own is; all or nothing."""
    account = find_account(user_id)
    changes = {name: value for name, value in changes.items() if value is not None}
    if changes.get("reset_suspicion") is False:
        del changes["reset_suspicion"]  # nothing to do (the AI Horde resets on false too)
    _may_modify(caller, account, changes)
    if not changes:
        raise errors.NoUserModSelected()
    if "kudos" in changes:
        awards.award_target(account)
    username = changes.get("username")
    if username is not None and len(username) > NAME_MAX_CHARS:
        raise errors.TooLongUserName(NAME_MAX_CHARS)
    logged = caller.moderator
    this = Account.objects.filter(pk=account.pk)
    answer: dict[str, Any] = {}

    def log(words: str) -> None:
        if logged:
            log_api_act(caller, account, words)

    with transaction.atomic():
        account = this.select_for_update().get()
        if "kudos" in changes:
            amount, by = Decimal(changes["kudos"]), unique_alias(caller)
            awards.award_kudos(account_id=account.pk, amount=amount, reason="awarded through the API", by=by)
            log(awarded(changes["kudos"]))
            answer["new_kudos"] = float(ledger.balance(account.pk))
        # The account's own columns, as the admin's change form sets them.
        columns = {column: changes[field] for field, column in COLUMNS if field in changes}
        if "worker_limit" in columns:
            columns["worker_limit"] = columns["worker_limit"] or None  # 0: no invitation, the horde's limit
        set_now = {column: value for column, value in columns.items() if getattr(account, column) != value}
        if set_now:
            this.update(**set_now)
            log(changed(Account, *set_now))
        answer.update({field: changes[field] for field, _ in COLUMNS if field in changes})
        if changes.get("generate_proxy_passkey"):
            answer["proxy_passkey"] = proxies.make_passkey(account=account)
            log(PASSKEY_MADE)
        if "trusted" in changes:
            if trust_accounts(accounts=this, trusted=changes["trusted"]):
                log(TRUST_WORDS[changes["trusted"]])
            answer["trusted"] = this.values_list("trusted", flat=True).get()
        if changes.get("flagged") is True and suspicion.flag(accounts=this, now=clock.now()):
            log(FLAGGED)
        if changes.get("flagged") is False or "reset_suspicion" in changes:
            # hordeops' flag is its suspicions' (`workers.suspicion`): lifting it forgets them.
            if clear_suspicions(accounts=this):
                log(SUSPICIONS_CLEARED)
        if "flagged" in changes:
            answer["flagged"] = this.exclude(flagged_at=None).exists()
        if "reset_suspicion" in changes:
            answer["new_suspicion"] = account.suspicions.count()
    if not logged:
        logger.info("account %s changed %s", account.pk, ", ".join(sorted(changes)))
    return answer


def award_by_api(*, moderator: Account, username: str, amount: int) -> int:
    """`POST /api/v2/kudos/award`: a moderator awards `amount` kudos to the account `username`
    names, minted (`kudos.awards`), logged as the admin's award is."""
    if not moderator.moderator:
        raise errors.NotAllowedAwards()
    account = awards.award_target(awards.account_named(username))
    with transaction.atomic():
        awards.award_kudos(
            account_id=account.pk,
            amount=Decimal(amount),
            reason="awarded through the API",
            by=unique_alias(moderator),
        )
        log_api_act(moderator, account, awarded(amount))
    return amount


# PUT /api/v2/status/modes: the AI Horde's names of the modes, and hordeops' (`HordeModes`).
MODE_NAMES = {"maintenance_mode": "maintenance", "invite_only_mode": "invite_only", "raid_mode": "raid"}


def set_modes_by_api(*, moderator: Account, changes: dict[str, bool]) -> dict[str, bool]:
    """`PUT /api/v2/status/modes`: a moderator sets the modes given (`MODE_NAMES`), as the admin
    sets them (`workers.modes.set_modes`), logged as the admin's change is; returns those set."""
    if not moderator.moderator:
        raise errors.NotModerator("Only a moderator may change the horde's modes.")
    given = {MODE_NAMES[name]: value for name, value in changes.items() if value is not None}
    if not given:
        raise errors.NoHordeModSelected()
    with transaction.atomic():
        before = modes.read()
        now = modes.set_modes(**given)
        differ = [name for name in given if getattr(before, name) != getattr(now, name)]
        if differ:
            log_api_act(moderator, HordeModes.objects.get(pk=1), changed(HordeModes, *differ))
    logger.warning("horde modes set by account %s: %s", moderator.pk, given)
    return {api: getattr(now, name) for api, name in MODE_NAMES.items() if name in given}
