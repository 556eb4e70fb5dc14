"""The teams in the admin (`front/admin/teams.py`): moderators list them with their live
workers, rename and describe them, and delete them, leaving their workers without a team."""

from django.utils import timezone

from workers.models import Team, Worker

LIST = "/admin/workers/team/"


def _team(trusted_owner, owner) -> Team:
    team = Team.objects.create(
        name="Direct Action", info="Anarchy is emergent order.", owner=trusted_owner.account
    )
    for name in ("member-a", "member-b", "gone-member"):
        owner.pop(name, models=["m1"])
    Worker.objects.filter(name__contains="member").update(team=team)
    Worker.objects.filter(name="gone-member").update(deleted_at=timezone.now())
    return team


def test_the_list_shows_each_team_with_its_creator_and_live_workers(moderator, trusted_owner, owner):
    team = _team(trusted_owner, owner)
    shown = moderator.get(LIST)
    assert shown.status_code == 200
    row = shown.content.decode().split(">Direct Action</a>")[1].split("</tr>")[0]
    assert "trusted-owner" in row and ">2<" in row
    page = moderator.get(f"{LIST}{team.pk}/change/").content.decode()
    assert "member-a" in page and "member-b" in page and "gone-member" not in page


def test_a_moderator_renames_and_deletes_a_team_and_its_workers_are_left_without_one(
    moderator, trusted_owner, owner
):
    team = _team(trusted_owner, owner)
    page = f"{LIST}{team.pk}/change/"
    inline = {"workers-TOTAL_FORMS": "2", "workers-INITIAL_FORMS": "2"}
    members = Worker.objects.filter(deleted_at__isnull=True).order_by("name")
    inline |= {f"workers-{i}-id": str(w.pk) for i, w in enumerate(members)}
    inline |= {f"workers-{i}-team": str(team.pk) for i, _ in enumerate(members)}
    saved = moderator.post(page, {"name": "Renamed By Mods", "info": "Calmer now.", **inline})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    team.refresh_from_db()
    assert (team.name, team.info) == ("Renamed By Mods", "Calmer now.")
    deleted = moderator.post(f"{LIST}{team.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    assert not Team.objects.exists()
    assert not Worker.objects.filter(team__isnull=False).exists()
