"""Teams (`GET`/`POST /api/v2/teams`, `GET`/`PATCH`/`DELETE /api/v2/teams/{id}`) and a worker's
`team` on `PUT /api/v2/workers/{id}`, as the AI Horde rules them (`workers/teams.py`)."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from workers.models import Account, Team, Worker


def _create(caller, **body):
    return caller.client.post("/api/v2/teams", body, format="json", HTTP_APIKEY=caller.api_key)


def _patch(caller, team_id, **body):
    return caller.client.patch(f"/api/v2/teams/{team_id}", body, format="json", HTTP_APIKEY=caller.api_key)


def _delete(caller, team_id):
    return caller.client.delete(f"/api/v2/teams/{team_id}", HTTP_APIKEY=caller.api_key)


def _join(caller, worker_name, team):
    worker = Worker.objects.get(name=worker_name)
    return caller.client.put(
        f"/api/v2/workers/{worker.pk}", {"team": team}, format="json", HTTP_APIKEY=caller.api_key
    )


def _refused(response, status: int, rc: str) -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert set(body) <= {"message", "rc", "errors"} and body["rc"] == rc and body["message"]
    return body


@pytest.fixture
def team(trusted_owner) -> dict:
    made = _create(trusted_owner, name="Direct Action", info="Anarchy is emergent order.")
    assert made.status_code == 200, made.content
    return made.json()


def test_a_trusted_account_creates_a_team_and_anyone_reads_it_alone_and_in_the_list(trusted_owner, team):
    made = Team.objects.get()
    assert team == {"id": str(made.pk), "name": "Direct Action", "info": "Anarchy is emergent order."}
    assert made.owner == trusted_owner.account
    read = APIClient().get(f"/api/v2/teams/{made.pk}")
    assert read.status_code == 200, read.content
    assert read.json() == {
        "name": "Direct Action",
        "id": str(made.pk),
        "info": "Anarchy is emergent order.",
        "requests_fulfilled": 0,
        "kudos": 0,
        "uptime": 0,
        "creator": f"trusted-owner#{trusted_owner.account.pk}",
        "worker_count": 0,
        "workers": [],
        "models": [],
    }
    assert APIClient().get("/api/v2/teams").json() == [read.json()]


def test_a_team_without_info_answers_a_null_info(trusted_owner):
    made = _create(trusted_owner, name="Quiet")
    assert made.json()["info"] is None
    assert APIClient().get(f"/api/v2/teams/{made.json()['id']}").json()["info"] is None


def test_an_untrusted_account_cannot_create_a_team(owner):
    _refused(_create(owner, name="Wannabes"), 403, "UntrustedTeamCreation")
    assert not Team.objects.exists()


def test_anonymous_cannot_create_a_team_and_no_key_is_refused(anonymous):
    Account.objects.filter(pk=anonymous.account.pk).update(trusted=True)
    _refused(_create(anonymous, name="Nobodies"), 403, "AnonForbidden")
    _refused(APIClient().post("/api/v2/teams", {"name": "Nobodies"}, format="json"), 401, "InvalidAPIKey")
    _refused(
        APIClient().post("/api/v2/teams", {"name": "Nobodies"}, format="json", HTTP_APIKEY="no-such-key"),
        401,
        "InvalidAPIKey",
    )
    assert not Team.objects.exists()


def test_a_team_name_is_unique_whatever_its_case(trusted_owner, make_caller, team):
    other = make_caller("other-trusted", trusted=True)
    _refused(_create(other, name="direct action"), 400, "TeamNameAlreadyExists")
    second = _create(other, name="Mutual Aid").json()
    _refused(_patch(other, second["id"], name="DIRECT ACTION"), 400, "TeamNameAlreadyExists")
    assert Team.objects.count() == 2


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "ab"},
        {"name": "x" * 101},
        {"name": 12345},
        {"name": None},
        {"name": "Good name", "info": "ab"},
        {"name": "Good name", "info": "x" * 1001},
        {"name": "Good name", "info": ["list"]},
    ],
)
def test_bad_team_input_is_a_400_in_the_hordes_shape(trusted_owner, body):
    _refused(_create(trusted_owner, **body), 400, "ValidationError")
    _refused(_create(trusted_owner, name="nul\x00name"), 400, "NulByteInPayload")
    assert not Team.objects.exists()


def test_the_creator_renames_and_describes_the_team(trusted_owner, team):
    changed = _patch(trusted_owner, team["id"], name="Direct Action 2", info="Still emergent.")
    assert changed.status_code == 200, changed.content
    assert changed.json() == {"id": team["id"], "name": "Direct Action 2", "info": "Still emergent."}
    renamed = _patch(trusted_owner, team["id"], name="Direct Action 3").json()
    assert renamed == {"id": team["id"], "name": "Direct Action 3", "info": "Still emergent."}
    assert Team.objects.get().name == "Direct Action 3"
    # Its own name again, in another case, is no clash with itself.
    assert _patch(trusted_owner, team["id"], name="direct action 3").status_code == 200
    _refused(_patch(trusted_owner, team["id"]), 400, "NoTeamModSelected")
    _refused(_patch(trusted_owner, team["id"], name="ab"), 400, "ValidationError")


def test_a_stranger_cannot_change_or_delete_anothers_team(make_caller, team):
    stranger = make_caller("stranger", trusted=True)
    _refused(_patch(stranger, team["id"], info="Taken over."), 403, "NotOwner")
    _refused(_patch(stranger, team["id"], name="Taken Over"), 403, "NotModerator")
    _refused(_delete(stranger, team["id"]), 403, "NotModerator")
    kept = Team.objects.get()
    assert (kept.name, kept.info) == ("Direct Action", "Anarchy is emergent order.")
    # A key on the read must be its creator's or a moderator's, as the AI Horde asks.
    read = APIClient().get(f"/api/v2/teams/{team['id']}", HTTP_APIKEY=stranger.api_key)
    _refused(read, 403, "NotModerator")


def test_anonymous_cannot_change_or_delete_a_team(anonymous, team):
    _refused(_patch(anonymous, team["id"], info="Anonymous was here."), 403, "NotOwner")
    _refused(_delete(anonymous, team["id"]), 403, "NotModerator")
    _refused(APIClient().delete(f"/api/v2/teams/{team['id']}"), 401, "InvalidAPIKey")
    assert Team.objects.exists()


def test_a_moderator_renames_and_deletes_anyones_team(make_caller, team):
    boss = make_caller("boss")
    Account.objects.filter(pk=boss.account.pk).update(moderator=True)
    assert _patch(boss, team["id"], name="Renamed By Mods").json()["name"] == "Renamed By Mods"
    assert _delete(boss, team["id"]).json() == {"deleted_id": team["id"], "deleted_name": "Renamed By Mods"}
    assert not Team.objects.exists()


def test_an_unknown_team_is_a_404_team_not_found(trusted_owner):
    for team_id in ("not-a-uuid", str(uuid.uuid4())):
        _refused(APIClient().get(f"/api/v2/teams/{team_id}"), 404, "TeamNotFound")
        _refused(_patch(trusted_owner, team_id, info="Nobody's."), 404, "TeamNotFound")
        _refused(_delete(trusted_owner, team_id), 404, "TeamNotFound")


def test_a_worker_joins_a_team_through_its_owners_put_and_leaves_it_with_an_empty_id(owner, team):
    owner.pop("team-player", models=["m1"])
    joined = _join(owner, "team-player", team["id"])
    assert joined.status_code == 200, joined.content
    assert joined.json() == {"team": "Direct Action"}
    worker = Worker.objects.get(name="team-player")
    assert str(worker.team_id) == team["id"]
    shown = APIClient().get(f"/api/v2/workers/{worker.pk}").json()
    assert shown["team"] == {"name": "Direct Action", "id": team["id"]}
    assert APIClient().get("/api/v2/workers").json()[0]["team"] == shown["team"]
    assert _join(owner, "team-player", "").json() == {"team": "None"}
    assert Worker.objects.get(name="team-player").team_id is None
    assert APIClient().get(f"/api/v2/workers/{worker.pk}").json()["team"] == {"name": None, "id": None}


def test_a_worker_cannot_join_an_unknown_team_nor_be_moved_by_a_stranger(owner, make_caller, team):
    owner.pop("team-player", models=["m1"])
    _refused(_join(owner, "team-player", str(uuid.uuid4())), 404, "TeamNotFound")
    _refused(_join(make_caller("stranger"), "team-player", team["id"]), 403, "NotModerator")
    assert Worker.objects.get(name="team-player").team_id is None


def test_the_team_totals_count_its_live_workers(owner, make_caller, team):
    owner.pop("member-a", models=["m1", "m2"])
    owner.pop("member-b", models=["m1"])
    owner.pop("outsider", models=["m3"])
    Worker.objects.filter(name="member-a").update(completed_jobs=3, kudos_rewards=10.5, kudos_uptime=2)
    Worker.objects.filter(name="member-b").update(completed_jobs=4, kudos_rewards=1.25)
    Worker.objects.filter(name="outsider").update(completed_jobs=100, kudos_rewards=100)
    for name in ("member-a", "member-b"):
        assert _join(owner, name, team["id"]).status_code == 200
    details = APIClient().get(f"/api/v2/teams/{team['id']}").json()
    assert (details["worker_count"], details["requests_fulfilled"], details["kudos"]) == (2, 7, 13.75)
    assert [(w["name"], w["type"], w["online"]) for w in details["workers"]] == [
        ("member-a", "text", True),
        ("member-b", "text", True),
    ]
    assert details["models"] == [{"name": "m1", "count": 2}, {"name": "m2", "count": 1}]
    # A deleted worker no longer counts; a deleted team leaves its workers without one.
    deleted = Worker.objects.get(name="member-b")
    assert owner.client.delete(f"/api/v2/workers/{deleted.pk}", HTTP_APIKEY=owner.api_key).status_code == 200
    assert APIClient().get(f"/api/v2/teams/{team['id']}").json()["worker_count"] == 1
    Team.objects.get().delete()
    assert not Worker.objects.filter(team__isnull=False).exists()


def test_the_teams_list_reads_the_same_statements_however_many_teams_and_workers(trusted_owner, team):
    def statements() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert APIClient().get("/api/v2/teams").status_code == 200
        return len(seen)

    trusted_owner.pop("member-a", models=["m1"])
    _join(trusted_owner, "member-a", team["id"])
    few = statements()
    for n in range(3):
        more = _create(trusted_owner, name=f"Team {n}").json()
        trusted_owner.pop(f"member-{n}-x", models=["m1"])
        _join(trusted_owner, f"member-{n}-x", more["id"])
    assert statements() == few == 2  # the teams with their creators, and their live workers
