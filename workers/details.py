"""Accounts and workers as the AI Horde's discovery routes show them (`horde/apis/models/v2.py`:
`UserDetails`, `WorkerDetails`), read from their own rows: no scan of jobs or generations.

`privileged` is the AI Horde's details privilege: the caller is the worker's owner or a
moderator. Only then are the owner and the like shown. Accounts are shown by `kudos.details`.
"""

from datetime import datetime
from typing import Any

from django.core.cache import cache

from workers.models import Account, Worker

# hordeops serves text only: the AI Horde's worker type for it.
TEXT = "text"


def unique_alias(account: Account) -> str:
    """The AI Horde's `username`: the name and the id, `alice#12`."""
    return f"{account.name}#{account.pk}"


def worker_details(worker: Worker, *, now: datetime, privileged: bool) -> dict[str, Any]:
    account = worker.account
    details: dict[str, Any] = {
        "type": TEXT,
        "name": worker.name,
        "id": str(worker.pk),
        "online": worker.is_online(now),
        "requests_fulfilled": worker.completed_jobs,
        "uncompleted_jobs": worker.uncompleted_jobs,
        "kudos_rewards": round(worker.kudos_rewards + worker.kudos_uptime, 2),
        "kudos_details": {
            "generated": round(worker.kudos_rewards, 2),
            # The AI Horde declares this one an Integer (WorkerKudosDetails) and its marshalling
            # truncates it: horde_sdk's model refuses a fraction, the normal case here.
            "uptime": int(worker.kudos_uptime),
        },
        "performance": worker.performance,
        "threads": worker.threads,
        "uptime": worker_uptime(worker),
        "maintenance_mode": worker.maintenance,
        "info": worker.info or None,
        "nsfw": worker.nsfw,
        "trusted": account.trusted,
        "flagged": False,
        # No team: the AI Horde's "None", which its marshalling makes two nulls.
        "team": {"name": worker.team.name, "id": str(worker.team_id)}
        if worker.team_id is not None
        else {"name": None, "id": None},
        "bridge_agent": worker.bridge_agent,
        "models": worker.served_models,
        "max_length": worker.max_length,
        "max_context_length": worker.max_context_length,
        "tokens_generated": worker.tokens_generated,
    }
    if privileged:
        details.update(privileged_details(account), paused=worker.paused)
    return details


def worker_uptime(worker: Worker) -> int:
    """Seconds from its first pop to its last: hordeops does not sum online spells."""
    return max(0, int((worker.last_pop_at - worker.created_at).total_seconds()))


def privileged_details(account: Account) -> dict[str, Any]:
    """What a worker's owner and the moderators see besides the public details (and the
    worker's own `paused`)."""
    return {"owner": unique_alias(account), "messages": [], "paused": False, "suspicious": 0}


# The online workers' public details, rendered once for every caller for this long, as the AI
# Horde keeps its worker list cached: rendering a large fleet's list is the route's whole cost.
ONLINE_LIST_SECONDS = 2
ONLINE_LIST_KEY = "hordeops:online-workers"


def online_workers(*, now: datetime) -> list[tuple[int, dict[str, Any], bool]]:
    """(account id, public details, paused) of every online worker, by name; cached
    ONLINE_LIST_SECONDS."""
    listed = cache.get(ONLINE_LIST_KEY)
    if listed is None:
        workers = Worker.objects.online(now).select_related("account", "team").order_by("name")
        listed = [(w.account_id, worker_details(w, now=now, privileged=False), w.paused) for w in workers]
        cache.set(ONLINE_LIST_KEY, listed, ONLINE_LIST_SECONDS)
    return listed
