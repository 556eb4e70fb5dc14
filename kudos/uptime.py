"""Uptime kudos (the AI Horde's `calculate_uptime_reward`): a worker's owner is paid for every
UPTIME_SECONDS its worker stays online outside maintenance, by the pass (`kudos.passes`).

Only a worker that may be offered jobs is paid: not a paused one, not one in maintenance (its
owner's or a moderator's), not one of a flagged account (`workers.suspicion`). Its context counts
up to what it has shown it serves (`counted_context`), not what its pop declares, which nothing
checks: an idle worker declaring a million tokens would otherwise earn ~100 times the base.

A worker is counted from the first pass that sees it online; one seen offline is counted anew
when it comes back. Each period is posted once (its key is the worker and the period's end),
minted by the treasury, all of it to escrow while the owner is untrusted.
"""

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from kudos import ledger, rates, sizes
from kudos.models import Event, Wallet
from workers.models import Worker

PERIOD = timedelta(seconds=rates.UPTIME_SECONDS)
# What any worker is counted to serve before it has shown more: the pop's default context.
UNSHOWN_CONTEXT = 2048
# The workers that may be offered jobs, and so earn uptime.
PAYABLE = Q(maintenance=False, maintenance_by_moderator=False, paused=False, account__flagged_at=None)


def counted_context(*, declared: int, served: int) -> int:
    """The context uptime is paid for: what the worker declares, within the largest context of a
    job it completed (`Worker.served_context`), or UNSHOWN_CONTEXT before it has shown more."""
    return min(declared, max(UNSHOWN_CONTEXT, served))


def pay_uptime(*, now: datetime) -> int:
    """Pay every online worker each period it completed since it was last paid; return how
    many periods were paid. Stops counting workers that went offline, into maintenance, were
    paused or whose account was flagged."""
    online = Worker.objects.online(now).filter(PAYABLE)
    Worker.objects.exclude(pk__in=online.values("pk")).filter(uptime_paid_until__isnull=False).update(
        uptime_paid_until=None
    )
    online.filter(uptime_paid_until__isnull=True).update(uptime_paid_until=now)
    paid = 0
    for worker_id in online.filter(uptime_paid_until__lte=now - PERIOD).values_list("pk", flat=True):
        paid += _pay(worker_id, now=now)
    return paid


def _pay(worker_id, *, now: datetime) -> int:
    with transaction.atomic():
        worker = (
            Worker.objects.select_for_update(of=("self",))
            .select_related("account")
            .filter(Q(pk=worker_id) & Q(uptime_paid_until__lte=now - PERIOD) & PAYABLE)
            .first()
        )
        if worker is None:  # paid, paused or flagged meanwhile
            return 0
        periods = 0
        while worker.uptime_paid_until + PERIOD <= now:
            worker.uptime_paid_until += PERIOD
            reward = rates.kudos(
                rates.uptime_reward(
                    max_context_length=counted_context(
                        declared=worker.max_context_length, served=worker.served_context
                    ),
                    billions=sizes.billions(worker.served_models[0]) if worker.served_models else None,
                    validated=rates.is_validated(worker.bridge_agent),
                )
            )
            account = worker.account
            escrowed = not account.trusted and not account.is_anonymous
            ledger.post(
                kind=Event.Kind.UPTIME,
                key=f"uptime:{worker.pk}:{int(worker.uptime_paid_until.timestamp())}",
                entries=[
                    ledger.to_system(Wallet.System.TREASURY, -reward),
                    ledger.to_account(account.pk, reward, escrow=escrowed),
                ],
                now=now,
            )
            worker.kudos_uptime += float(reward)
            periods += 1
        worker.save(update_fields=["uptime_paid_until", "kudos_uptime"])
    return periods
