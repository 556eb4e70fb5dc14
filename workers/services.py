from datetime import datetime

from django.db import IntegrityError, transaction

from hordeops import errors
from workers.models import Account, Worker, hash_api_key, new_api_key


def create_account(*, name: str, trusted: bool = False) -> tuple[Account, str]:
    """Create an account and return it with its API key, which is stored only hashed."""
    api_key = new_api_key()
    account = Account.objects.create(name=name, trusted=trusted, api_key_hash=hash_api_key(api_key))
    return account, api_key


def authenticate(*, api_key: str | None) -> Account:
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key in the apikey header.")
    account = Account.objects.for_api_key(api_key)
    if account is None:
        raise errors.InvalidAPIKey()
    return account


def check_in_worker(
    *,
    account: Account,
    name: str,
    served_models: list[str],
    max_length: int,
    max_context_length: int,
    threads: int,
    nsfw: bool,
    chat: bool,
    bridge_agent: str,
    now: datetime,
) -> Worker:
    """Find or create the worker named by a pop, and record what it declares now."""
    if account.is_anonymous:
        raise errors.AnonForbiddenWorker()
    declared = {
        "served_models": served_models,
        "max_length": max_length,
        "max_context_length": max_context_length,
        "threads": threads,
        "nsfw": nsfw,
        "chat": chat,
        "bridge_agent": bridge_agent,
        "last_pop_at": now,
    }
    worker = Worker.objects.filter(name=name).first()
    if worker is None:
        try:
            with transaction.atomic():
                return Worker.objects.create(name=name, account=account, created_at=now, **declared)
        except IntegrityError:
            # Another pop created the same name first.
            worker = Worker.objects.get(name=name)
    if worker.account_id != account.id:
        raise errors.WrongCredentials("This worker name is owned by another account.")
    Worker.objects.filter(pk=worker.pk).update(**declared)
    for field, value in declared.items():
        setattr(worker, field, value)
    return worker


def set_trust(*, accounts, trusted: bool) -> int:
    """Trust or untrust accounts; their workers' next pops get the matching lease cap."""
    return accounts.exclude(trusted=trusted).update(trusted=trusted)


def set_maintenance(*, workers, maintenance: bool, reason: str = "") -> int:
    """Put workers into maintenance (they then serve only their owner) or take them out."""
    if maintenance:
        return workers.update(maintenance=True, maintenance_reason=reason or "Set by a moderator.")
    # Leaving maintenance starts the abort window afresh, as the AI Horde's reset does.
    return workers.update(maintenance=False, maintenance_reason="", aborted_jobs=0)
