"""A pop's check-in: authenticate its key, find or create the worker it names within the
limits (per account, per client address, the horde's modes), record what it declares."""

import ipaddress
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from hordeops import errors
from hordeops.ratelimit import address_bucket
from hordeops.rows import fetch_instances
from workers import modes, sql
from workers.capacity import check_in_fresh_since
from workers.declaration import WorkerDeclaration
from workers.models import Account, Worker, hash_api_key
from workers.services import refuse_suspended, required_api_key


def check_in_worker(
    *, api_key: str | None, declaration: WorkerDeclaration, now: datetime, address: str = ""
) -> Worker:
    """Authenticate a pop's key, find or create the worker its declaration names, and record
    what the worker declares now; return the worker with its account (the key's) loaded.

    One statement for a known name: the key's account is looked up; a name of
    this account's updates what the worker declares and its last pop; a name owned by another
    account is refused, as is the anonymous account (it may not own workers). The last pop
    is written only when it is older than `capacity.check_in_fresh_since` (a tenth of the
    online window), as the AI Horde debounces its check-in, unless something the worker
    declares changed: then it is written at once. Most pops thus write nothing: a worker
    row update touches five indexes, the GIN index of its models among them. A new name costs
    two statements more, in one transaction: the account's and the address's locks
    (`sql.lock_new_name`), then the check-in again, which creates the worker within the limits.

    `address` is the pop's client address (`hordeops.ratelimit.request_address`): kept on the
    worker as the limits count it, and a new worker of an untrusted account is refused once
    WORKER_LIMIT_PER_ADDRESS workers of untrusted accounts come from it.
    """
    limited = is_limited_address(address)
    address = address_bucket(address) if address else ""
    params = {
        "api_key_hash": hash_api_key(required_api_key(api_key)),
        "name": declaration.name,
        "served_models": declaration.models,
        "max_length": declaration.max_length,
        "max_context_length": declaration.max_context_length,
        "threads": declaration.threads,
        "nsfw": declaration.nsfw,
        "chat": declaration.chat,
        "bridge_agent": declaration.bridge_agent,
        "tools": declaration.tools,
        "structured_outputs": declaration.structured_outputs,
        "now": now,
        "fresh_since": check_in_fresh_since(now),
        "worker_limit_trusted": settings.WORKER_LIMIT_TRUSTED,
        "worker_limit_untrusted": settings.WORKER_LIMIT_UNTRUSTED,
        "address": address,
        "limit_address": address if limited else None,
        "worker_limit_per_address": settings.WORKER_LIMIT_PER_ADDRESS,
        "may_create": False,
    }
    account, worker = _checked_in(params)
    if worker is None:
        # A new name: created in a second try, under the account's lock and its address's, so
        # that concurrent first pops are counted one after another (a known name pays nothing).
        with transaction.atomic():
            with connection.cursor() as cursor:
                address_lock = f"workers-address:{address}" if limited and not account.trusted else None
                cursor.execute(sql.lock_new_name(), {"account_id": account.pk, "address_lock": address_lock})
            account, worker = _checked_in({**params, "may_create": True})
    # No worker: a new name past the account's limit or its address's, or another account
    # created the name in the same instant.
    if worker is None:
        refuse_past_limits(account, address if limited else None)
    if worker is None or worker.account_id != account.id:
        raise errors.WrongCredentials("This worker name is owned by another account.")
    if worker.created_at == now and not account.trusted:
        refuse_new_worker_by_mode(worker, account)
    worker.account = account
    return worker


def _checked_in(params: dict[str, Any]) -> tuple[Account, Worker | None]:
    """The check-in's account and worker, the account refused if it is unknown, suspended or
    anonymous."""
    found = fetch_instances(sql.check_in(), params, (Account, None), (Worker, None))
    if found is None:
        raise errors.InvalidAPIKey()
    account, worker = found
    refuse_suspended(account)
    if account.is_anonymous:
        raise errors.AnonForbiddenWorker()
    return account, worker


def is_limited_address(address: str) -> bool:
    """Whether a pop from `address` counts towards WORKER_LIMIT_PER_ADDRESS: any but loopback
    (the horde's own host) and an unknown one, while the limit is on."""
    if not address or settings.WORKER_LIMIT_PER_ADDRESS <= 0:
        return False
    try:
        return not ipaddress.ip_address(address).is_loopback
    except ValueError:
        return True


def refuse_past_limits(account: Account, address: str | None) -> None:
    """Say which limit refused a new worker (the check-in's own statement applied them);
    `address` is the limited address as counted, None when it is not limited."""
    if Worker.objects.live().filter(account=account).count() >= account.workers_allowed:
        raise errors.TooManyWorkers(account.workers_allowed)
    if not account.trusted and address is not None:
        there = Worker.objects.live().filter(address=address, account__trusted=False).count()
        if there >= max(settings.WORKER_LIMIT_PER_ADDRESS, account.worker_limit or 0):
            raise errors.TooManySameIPs()


def refuse_new_worker_by_mode(worker: Worker, account: Account) -> None:
    """In invite-only mode an untrusted account's new worker is refused unless a moderator
    invited it (gave it a worker limit: the AI Horde's `worker_invited`, within which the
    check-in counts it), in raid mode always: the row its first pop just made is removed again
    (it holds nothing yet)."""
    now_modes = modes.read()
    if now_modes.invite_only and not account.worker_limit:
        refused = errors.WorkerInviteOnly()
    elif now_modes.raid:
        refused = errors.RaidMode()
    else:
        return
    Worker.objects.filter(pk=worker.pk, completed_jobs=0).delete()
    raise refused
