"""Teams (the AI Horde's `/v2/teams`, `horde/classes/base/team.py`): a trusted account makes one,
its creator or a moderator renames, describes or deletes it, and a worker's owner dedicates the
worker to one (`services.change_worker`).

A team's totals are its live workers' own counters, summed when shown: the submit writes no
team row, and a worker that joins or leaves a team brings or takes its history with it (the AI
Horde keeps counters of what was done while in the team instead).
"""

from collections import Counter
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.db.models import Prefetch
from django.db.models.functions import Lower

from hordeops import errors
from workers.details import TEXT, unique_alias, worker_uptime
from workers.models import Account, Team, Worker


def teams() -> "list[Team]":
    """Every team, by name, with its creator and live workers, in three statements."""
    return list(_with_workers(Team.objects.all()))


def find_team(team_id: str | UUID, *, details: bool = True) -> Team:
    """The team of that id (with its creator and live workers for its `details`); TeamNotFound
    for any other id."""
    try:
        pk = team_id if isinstance(team_id, UUID) else UUID(str(team_id))
    except ValueError:
        raise errors.TeamNotFound(f"Team with ID '{team_id}' not found.") from None
    found = Team.objects.filter(pk=pk)
    team = (_with_workers(found) if details else found).first()
    if team is None:
        raise errors.TeamNotFound(f"Team with ID '{team_id}' not found.")
    return team


def _with_workers(teams):
    live = Worker.objects.live().order_by("name")
    return teams.select_related("owner").prefetch_related(Prefetch("workers", queryset=live))


def team_details(team: Team, *, now: datetime) -> dict[str, Any]:
    """The AI Horde's `TeamDetails`, as horde_sdk 0.33.3 models it: the totals are its live
    workers' (`requests_fulfilled` their completed jobs, `kudos` what they earned by jobs and
    uptime, `uptime` their seconds online), `models` how many of them serve each model."""
    workers = list(team.workers.all())
    models = Counter(model for worker in workers for model in worker.served_models)
    return {
        "name": team.name,
        "id": str(team.pk),
        "info": team.info or None,
        "requests_fulfilled": sum(w.completed_jobs for w in workers),
        "kudos": round(sum(w.kudos_rewards + w.kudos_uptime for w in workers), 2),
        "uptime": sum(worker_uptime(w) for w in workers),
        "creator": unique_alias(team.owner),
        "worker_count": len(workers),
        "workers": [
            {"type": TEXT, "name": w.name, "id": str(w.pk), "online": w.is_online(now)} for w in workers
        ],
        "models": [{"name": name, "count": count} for name, count in sorted(models.items())],
    }


def changed_answer(team: Team) -> dict[str, Any]:
    """The AI Horde's `ModifyTeam`: the team's id, name and info after the change (whole, as
    horde_sdk's model needs `id` and `name` in every answer)."""
    return {"id": str(team.pk), "name": team.name, "info": team.info or None}


def _name_taken(name: str, *, but: UUID | None = None) -> bool:
    return Team.objects.annotate(lower=Lower("name")).filter(lower=name.lower()).exclude(pk=but).exists()


def create_team(*, caller: Account, name: str, info: str | None = None) -> Team:
    """POST /api/v2/teams: only a trusted account, never the anonymous one, makes a team; its
    name is unique whatever its case."""
    if caller.is_anonymous:
        raise errors.AnonForbidden()
    if not caller.trusted:
        raise errors.UntrustedTeamCreation()
    if _name_taken(name):
        raise errors.TeamNameAlreadyExists(f"The specified team name '{name}' is already taken!")
    try:
        with transaction.atomic():  # a name taken in the same instant: the unique index says so
            return Team.objects.create(name=name, info=info or "", owner=caller)
    except IntegrityError:
        raise errors.TeamNameAlreadyExists(f"The specified team name '{name}' is already taken!") from None


def modify_team(*, caller: Account, team_id: str, name: str | None = None, info: str | None = None) -> Team:
    """PATCH /api/v2/teams/{id}: its creator or a moderator renames or describes it (a stranger's
    info is NotOwner, a stranger's name NotModerator, as the AI Horde answers them)."""
    with transaction.atomic():
        team = find_team(team_id)
        if info is not None:
            if not team.may_change(caller):
                raise errors.NotOwner("Only the team's creator or a moderator may change it.")
            team.info = info
        if name is not None:
            if not team.may_change(caller):
                raise errors.NotModerator("Only the team's creator or a moderator may rename it.")
            if _name_taken(name, but=team.pk):
                raise errors.TeamNameAlreadyExists(f"The specified team name '{name}' is already taken!")
            team.name = name
        if name is None and info is None:
            raise errors.NoTeamModSelected()
        try:
            with transaction.atomic():
                team.save(update_fields=["name", "info"])
        except IntegrityError:
            raise errors.TeamNameAlreadyExists(
                f"The specified team name '{name}' is already taken!"
            ) from None
    return team


def delete_team(*, caller: Account, team_id: str) -> dict[str, str]:
    """DELETE /api/v2/teams/{id}: its creator or a moderator deletes it; its workers are left
    without a team (the foreign key's SET NULL)."""
    team = find_team(team_id)
    if not team.may_change(caller):
        raise errors.NotModerator("Only the team's creator or a moderator may delete it.")
    Team.objects.filter(pk=team.pk).delete()
    return {"deleted_id": str(team.pk), "deleted_name": team.name}
