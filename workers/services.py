import ipaddress
import logging
from collections import Counter
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import redis.exceptions
from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction

from hordeops import clock, errors, timeouts
from hordeops.ratelimit import address_bucket, is_unreadable
from hordeops.rows import fetch_instance
from workers import modes, sql, suspicion
from workers.capacity import online_since
from workers.details import ONLINE_LIST_KEY
from workers.models import (
    Account,
    AddressTimeout,
    Registration,
    Suspicion,
    Worker,
    hash_api_key,
    new_api_key,
)
from workers.teams import find_team

logger = logging.getLogger(__name__)

MAINTENANCE_REASON = (
    "Maintenance mode activated because worker is dropping too many jobs. "
    "Please investigate its speed and stability before leaving maintenance."
)


def create_account(*, name: str, trusted: bool = False, pseudonymous: bool = False) -> tuple[Account, str]:
    """Create an account and return it with its API key, which is stored only hashed."""
    api_key = new_api_key()
    with transaction.atomic():
        account = Account.objects.create(
            name=name, trusted=trusted, pseudonymous=pseudonymous, api_key_hash=hash_api_key(api_key)
        )
    return account, api_key


# How long an address's sign-ups count against REGISTRATIONS_PER_ADDRESS.
REGISTRATION_WINDOW = timedelta(days=1)


def refuse_sign_up(*, address: str, pseudonymous: bool = True) -> None:
    """Refuse a sign-up from `address` the horde's state forbids whatever the form says: a
    timed-out address (403 TimeoutIP), or in raid mode any pseudonymous one (403,
    `SignUpClosedInRaid`: a provider's identity may still sign up, as the AI Horde decides); an
    address a proxy garbled (400), which would escape both."""
    if is_unreadable(address):
        raise errors.UnreadableAddress()
    if (refused := timeouts.refusal(address)) is not None:
        raise refused
    if pseudonymous and modes.read().raid:
        raise errors.SignUpClosedInRaid()


def sign_up(*, name: str, address: str, now: datetime) -> tuple[Account, str]:
    """A pseudonymous account made through the sign-up page from `address`, and its key: refused
    as `refuse_sign_up` says, or past REGISTRATIONS_PER_ADDRESS accounts from the address in a
    day (429 TooManyRegistrations; loopback is not counted, 0 turns the limit off)."""
    refuse_sign_up(address=address)
    bucket = address_bucket(address) if address else ""
    limit = settings.REGISTRATIONS_PER_ADDRESS
    counted = bool(bucket) and limit > 0 and not _is_loopback(bucket)
    with transaction.atomic():
        if counted:
            # Under the address's lock, the count's snapshot holds every sign-up committed
            # before: two at once cannot both take the last place.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"sign-up:{bucket}"])
            Registration.objects.filter(created_at__lt=now - REGISTRATION_WINDOW).delete()
            if Registration.objects.filter(address=bucket).count() >= limit:
                raise errors.TooManyRegistrations(limit)
            Registration.objects.create(address=bucket, created_at=now)
        return create_account(name=name, pseudonymous=True)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_network(address, strict=False).is_loopback
    except ValueError:
        return False


def create_moderator(*, name: str, password: str):
    """A staff user in the Moderators group, its password checked by AUTH_PASSWORD_VALIDATORS
    (ValidationError) and its name free (IntegrityError). The group is made if it is missing."""
    from django.contrib.auth.models import Group, Permission, User
    from django.contrib.auth.password_validation import validate_password

    from workers.moderation import grant_moderators

    validate_password(password, User(username=name))
    with transaction.atomic():
        user = User.objects.create_user(name, password=password, is_staff=True)
        user.groups.add(grant_moderators(Group, Permission))
    return user


def authenticate(*, api_key: str | None) -> Account:
    """The key's account, refused if the key is unknown or the account suspended."""
    account = key_account(api_key=api_key)
    refuse_suspended(account)
    return account


def key_account(*, api_key: str | None) -> Account:
    """The key's account, refused if the key is unknown. A suspended account is returned: the
    routes that queue refuse it in their admission (`jobs.admission`), with the horde's rules."""
    # Every authenticated call runs this: raw SQL skips the ORM's compiling (half the CPU),
    # and, prepared, PostgreSQL's planning.
    account = fetch_instance(Account, sql.account_for_api_key(), [hash_api_key(required_api_key(api_key))])
    if account is None:
        raise errors.InvalidAPIKey()
    return account


def refuse_suspended(account: Account) -> None:
    """A suspended account's key works nowhere: the refusal names the moderator's reason."""
    if account.suspended_at is not None:
        raise errors.AccountSuspended(account.suspension_reason)


def mark_suspended(*, accounts, reason: str, now: datetime) -> list[Account]:
    """The workers app's step of a suspension (`front.moderation.suspend_accounts`): the
    accounts not yet suspended are, their keys refused from now on. Returns those marked now."""
    with transaction.atomic():
        suspended = list(accounts.select_for_update().filter(suspended_at__isnull=True))
        Account.objects.filter(pk__in=[a.pk for a in suspended]).update(
            suspended_at=now, suspension_reason=reason[:500]
        )
    return suspended


def lift_suspensions(*, accounts) -> int:
    return accounts.exclude(suspended_at=None).update(suspended_at=None, suspension_reason="")


def reset_api_key(*, account: Account) -> str:
    """Give the account a new key (the old one stops working at once) and return it: it is
    shown once, stored only hashed."""
    api_key = new_api_key()
    Account.objects.filter(pk=account.pk).update(api_key_hash=hash_api_key(api_key))
    return api_key


def required_api_key(api_key: str | None) -> str:
    """The key as sent, refused if it is missing or empty (before any query)."""
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key in the apikey header.")
    return api_key


def time_out_address(
    *, network: str, until: datetime, reason: str = "", by: str, now: datetime
) -> AddressTimeout:
    """Put an address or a network into timeout until `until` (a timeout it has already is
    replaced), and have every web process refuse it within a second (`hordeops.timeouts`)."""
    try:
        name = timeouts.shown(timeouts.network_to_time_out(network))
    except timeouts.RefusedNetwork as refused:
        raise errors.BadRequest(str(refused)) from None
    except ValueError:
        raise errors.BadRequest("Invalid IP Address") from None
    with transaction.atomic():
        row, _ = AddressTimeout.objects.update_or_create(
            network=name,
            defaults={"until": until, "reason": reason[:500], "created_by": by[:150], "created_at": now},
        )
    publish_address_timeouts(now=now)
    logger.info("address %s in timeout until %s, by %s", name, until.isoformat(), by)
    return row


def lift_address_timeouts(*, networks: list[str], by: str, now: datetime) -> int:
    """End the timeouts of these addresses or networks (as `time_out_address` names them)."""
    names = [_timeout_name(network) for network in networks]
    # By what each row holds, not its name: a row named before single IPv6 addresses were held
    # as their /64 (`2001:db8::1`) is lifted by any address of that /64.
    held = {timeouts.network(name) for name in names}
    rows = [row.pk for row in AddressTimeout.objects.all() if timeouts.network(row.network) in held]
    lifted, _ = AddressTimeout.objects.filter(pk__in=rows).delete()
    publish_address_timeouts(now=now)
    logger.info("timeouts of %s lifted by %s", ", ".join(names), by)
    return lifted


def _worker_address(worker_id: UUID) -> tuple[Worker, str]:
    """The live worker and the address its timeout is named by, or the AI Horde's refusals."""
    worker = Worker.objects.live().filter(pk=worker_id).first()
    if worker is None:
        raise errors.WorkerNotFound(f"Worker with ID '{worker_id}' not found.")
    if not worker.address:
        raise errors.BadRequest(
            "This worker has no known address: it has not popped since addresses are kept."
        )
    try:
        name = timeouts.shown(timeouts.network_to_time_out(worker.address))
    except ValueError:  # RefusedNetwork too: its words would show the address
        raise errors.BadRequest(
            "This worker's address cannot be put into timeout (the horde's own or its proxy's)."
        ) from None
    return worker, name


def block_worker_address(*, worker_id: UUID, days: int, by: str, now: datetime) -> AddressTimeout:
    """Put a worker's address into timeout for `days` (an IPv6 one as its /64), the moderator
    never seeing it (the AI Horde's `/v2/operations/block_worker_ipaddr`)."""
    worker, name = _worker_address(worker_id)
    return time_out_address(
        network=name,
        until=now + timedelta(days=days),
        reason=f"address of worker {worker.name}",
        by=by,
        now=now,
    )


def unblock_worker_address(*, worker_id: UUID, by: str, now: datetime) -> int:
    """End the timeout of a worker's address, as `block_worker_address` set it."""
    _, name = _worker_address(worker_id)
    return lift_address_timeouts(networks=[name], by=by, now=now)


def _timeout_name(network: str) -> str:
    """An address or network as its timeout is named (`AddressTimeout.network`), or 400; its
    bounds are not checked here (a timeout set before them may still be lifted)."""
    try:
        return timeouts.shown(timeouts.network(network))
    except ValueError:
        raise errors.BadRequest("Invalid IP Address") from None


def publish_address_timeouts(*, now: datetime) -> int:
    """Give the routes the timeouts in force (the beat pass's too: Redis may have lost them).
    Without Redis the rows stay the record, and the beat pass publishes them once it is back."""
    active = AddressTimeout.objects.active(now).values_list("network", "until")
    try:
        timeouts.publish({network: until.timestamp() for network, until in active})
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        logger.warning("address timeouts not published: Redis is unavailable")
    return len(active)


def set_trust(*, accounts, trusted: bool) -> int:
    """Trust or untrust accounts; their workers' next pops get the matching lease cap."""
    return accounts.exclude(trusted=trusted).update(trusted=trusted)


def set_maintenance(*, workers, maintenance: bool, reason: str = "", by_moderator: bool = False) -> int:
    """Put workers into maintenance (they then serve only their owner) or take them out. A
    moderator's maintenance binds: its owner cannot lift it (`modify_worker`)."""
    if maintenance:
        return workers.update(
            maintenance=True,
            maintenance_reason=reason or "Set by a moderator.",
            maintenance_by_moderator=by_moderator,
        )
    # Leaving maintenance starts the abort window afresh, as the AI Horde's reset does.
    return workers.update(
        maintenance=False, maintenance_reason="", maintenance_by_moderator=False, aborted_jobs=0
    )


def set_paused(*, workers, paused: bool) -> int:
    """Pause workers (offered no jobs, though they pop on) or unpause them: a moderator's."""
    return workers.update(paused=paused)


def count_aborts(*, counts: Counter[UUID], now: datetime, given_back: bool = False) -> list[str]:
    """Count aborts (per worker id) in each worker's one-hour window, and, for a give-back,
    its give-backs; past WORKER_ABORT_MAINTENANCE_THRESHOLD the worker goes into maintenance.
    Each trip into maintenance, and giving back too much, is a suspicion (`workers.suspicion`).
    Returns the names of the workers now in maintenance. Runs in the caller's transaction (the
    stale pass's or a give-back's), so the aborts and their count commit together."""
    ids, added = zip(*counts.items(), strict=False)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.count_aborts(),
            {
                "ids": list(ids),
                "added": list(added),
                "now": now,
                "window_start": now - Worker.ABORT_WINDOW,
                "threshold": settings.WORKER_ABORT_MAINTENANCE_THRESHOLD,
                "reason": MAINTENANCE_REASON,
                "given_back": given_back,
            },
        )
        rows = cursor.fetchall()
    for worker_id, account_id, _, _, tripped, gave, completed in rows:
        found = []
        if tripped:
            threshold = settings.WORKER_ABORT_MAINTENANCE_THRESHOLD
            found.append((Suspicion.Reason.ABORTS, f"more than {threshold} aborts within an hour"))
        if given_back and suspicion.gives_back_too_much(given_back=gave, completed=completed):
            detail = f"gave back {gave} of the {gave + completed} jobs it took"
            found.append((Suspicion.Reason.GIVE_BACKS, detail))
        for reason, detail in found:
            suspicion.report(
                account_id=account_id, worker_id=worker_id, reason=reason, detail=detail, now=now
            )
    return [name for _, _, name, in_maintenance, *_ in rows if in_maintenance]


def modify_worker(*, api_key: str | None, worker_id: UUID, **changes: Any) -> dict[str, Any]:
    """PUT /api/v2/workers/{id}, as the AI Horde rules it: the owner or a moderator may set
    maintenance, the info note, the name and the team, a moderator alone `paused`; return what
    changed.
    `changes` are `change_worker`'s."""
    return change_worker(caller=authenticate(api_key=api_key), worker_id=worker_id, **changes)


def change_worker(
    *,
    caller: Account,
    worker_id: UUID,
    maintenance: bool | None = None,
    maintenance_msg: str | None = None,
    info: str | None = None,
    name: str | None = None,
    paused: bool | None = None,
    team: str | None = None,
) -> dict[str, Any]:
    """A worker changed by `caller` (`modify_worker`'s rules), for a caller already signed in:
    the route's, or the account page's owner."""
    with transaction.atomic():
        worker = Worker.objects.live().select_for_update().filter(pk=worker_id).first()
        if worker is None:
            raise errors.WorkerNotFound()
        this = Worker.objects.filter(pk=worker.pk)
        may = caller.moderator or caller.pk == worker.account_id
        changed: dict[str, Any] = {}
        if paused is not None:
            if not caller.moderator:
                raise errors.NotModerator()
            set_paused(workers=this, paused=paused)
            changed["paused"] = paused
        if team is not None:
            if not may:
                raise errors.NotModerator()
            if caller.is_anonymous:
                raise errors.AnonForbiddenWorker()
            # An empty id leaves its team; the answer says "None", as the AI Horde's does.
            joined = find_team(team, details=False) if team else None
            this.update(team=joined)
            changed["team"] = joined.name if joined else "None"
        if maintenance is not None:
            if not may:
                raise errors.NotOwner()
            if worker.maintenance_by_moderator and not caller.moderator:
                raise errors.NotModerator(
                    f"A moderator put this worker into maintenance ({worker.maintenance_reason}): "
                    "only a moderator can change it."
                )
            by_owner = caller.pk == worker.account_id and not caller.moderator
            reason = maintenance_msg or (errors.WorkerMaintenance.default_message if by_owner else "")
            set_maintenance(workers=this, maintenance=maintenance, reason=reason, by_moderator=not by_owner)
            changed["maintenance"] = maintenance
        if info is not None:
            if not may:
                raise errors.NotOwner()
            this.update(info=info)
            changed["info"] = info
        if name is not None:
            if not may:
                raise errors.NotModerator()
            if Worker.objects.live().filter(name=name).exclude(pk=worker.pk).exists():
                raise errors.WorkerNameAlreadyExists()
            try:
                with transaction.atomic():  # a name taken in the same instant: the unique index says so
                    this.update(name=name)
            except IntegrityError:
                raise errors.WorkerNameAlreadyExists() from None
            changed["name"] = name
        if not changed:
            raise errors.NoValidActions()
    return changed


def delete_worker(*, api_key: str | None, worker_id: UUID, now: datetime | None = None) -> dict[str, str]:
    """DELETE /api/v2/workers/{id}, as the AI Horde rules it: its owner or a moderator may.

    The worker is hidden everywhere but the admin and offline at once, and its name is free: its
    next pop under that name makes a new worker. The row stays, so that its generations keep
    their history and a job it still holds can be submitted: nothing in flight is lost.

    A worker a moderator holds (paused, or in a moderator's maintenance) only a moderator may
    delete: the new row its name would make starts clean, so the owner's delete would shed the hold.
    """
    caller = authenticate(api_key=api_key)
    now = now or clock.now()
    with transaction.atomic():
        worker = Worker.objects.live().select_for_update().filter(pk=worker_id).first()
        if worker is None:
            raise errors.WorkerNotFound()
        if not caller.moderator and caller.pk != worker.account_id:
            raise errors.NotModerator("Only the worker's owner or a moderator may delete it.")
        if not caller.moderator and (hold := _moderators_hold(worker)):
            raise errors.NotModerator(f"A moderator {hold}: only a moderator can delete it.")
        offline = min(worker.last_pop_at, online_since(now) - timedelta(microseconds=1))
        Worker.objects.filter(pk=worker.pk).update(deleted_at=now, last_pop_at=offline)
    logger.info("worker %s deleted by account %s", worker.pk, caller.pk)
    return {"deleted_id": str(worker.pk), "deleted_name": worker.name}


def _moderators_hold(worker: Worker) -> str | None:
    """How a moderator holds the worker, worded for its owner; None when no moderator does."""
    if worker.paused:
        return "paused this worker"
    if worker.maintenance and worker.maintenance_by_moderator:
        return f"put this worker into maintenance ({worker.maintenance_reason})"
    return None


def say_goodbye(*, api_key: str | None, name: str, now: datetime) -> Worker:
    """POST /api/v2/workers/goodbye: the worker `name` of the key's account stops, so it is
    offline at once (`Worker.left_at`) rather than for the rest of WORKER_ONLINE_SECONDS;
    its next pop brings it back. Idempotent: a second goodbye keeps the first one's time.

    Only its owner's key may say it (another's: WrongCredentials, as the pop answers). The
    jobs it still holds are its own business: the bridge finishes or gives them back first,
    and a job it still submits is accepted, as for a deleted worker.
    """
    caller = authenticate(api_key=api_key)
    if caller.is_anonymous:
        raise errors.AnonForbiddenWorker()
    worker = Worker.objects.live().filter(name=name).first()
    if worker is None:
        raise errors.WorkerNotFound("No worker with that name.")
    if worker.account_id != caller.pk:
        raise errors.WrongCredentials("This worker name is owned by another account.")
    Worker.objects.filter(pk=worker.pk, left_at__isnull=True).update(left_at=now)
    # The cached online list would show it for up to 2 s more: the list is one key, dropped.
    cache.delete(ONLINE_LIST_KEY)
    logger.info("worker %s said goodbye", worker.pk)
    return worker
