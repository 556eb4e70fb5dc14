"""Users and the horde's modes over the horde API, as the AI Horde's moderators change them:
GET /api/v2/users, PUT /api/v2/users/{id}, POST /api/v2/kudos/award, PUT /api/v2/status/modes.
Every moderator's act is the admin's own step, logged in the admin's history as there."""

from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command

from front import moderation
from kudos import ledger
from kudos.models import Event
from tests.conftest import give_kudos
from workers.models import Account, HordeModes, Suspicion


@pytest.fixture
def boss(make_caller):
    caller = make_caller("boss")
    Account.objects.filter(pk=caller.account.pk).update(moderator=True)
    caller.account.refresh_from_db()
    return caller


def put_user(caller, account, body, api_key=None):
    return caller.client.put(
        f"/api/v2/users/{account.pk}", body, format="json", HTTP_APIKEY=api_key or caller.api_key
    )


def refusal(answer) -> tuple[int, str]:
    body = answer.json()
    assert set(body) >= {"message", "rc"} and body["message"], body
    return answer.status_code, body["rc"]


def entries(account) -> list[str]:
    rows = LogEntry.objects.filter(content_type__model="account", object_id=str(account.pk)).order_by("pk")
    return list(rows.values_list("change_message", flat=True))


def test_the_users_list_pages_every_account_by_kudos_or_by_age(make_caller, django_assert_max_num_queries):
    callers = [make_caller(f"user-{n:02}") for n in range(27)]
    give_kudos(callers[3], "500")
    give_kudos(callers[20], "900")
    client = callers[0].client

    with django_assert_max_num_queries(5):  # the order by kudos made, then kept in Redis
        first = client.get("/api/v2/users").json()
    with django_assert_max_num_queries(4):
        assert len(client.get("/api/v2/users?page=2").json()) == 3
    with django_assert_max_num_queries(4):
        assert len(client.get("/api/v2/users?sort=age&page=2").json()) == 3
    assert [user["username"] for user in first[:2]] == [
        f"user-20#{callers[20].account.pk}",
        f"user-03#{callers[3].account.pk}",
    ]
    assert len(first) == 25 and first[0]["kudos"] == 900 and "worker_ids" not in first[0]
    everyone = first + client.get("/api/v2/users?page=2").json()
    assert len(everyone) == 27 + 1  # with the migration's Anonymous account
    by_age = client.get("/api/v2/users?sort=age&page=1").json()
    assert [user["id"] for user in by_age[1:4]] == [c.account.pk for c in callers[:3]]

    # As the AI Horde reads them: an unknown sort is by kudos, a page below 1 the first, one past
    # the last empty; a page that is no number is refused.
    def names(path):
        return [user["username"] for user in client.get(path).json()]

    assert (
        names("/api/v2/users?sort=bogus") == names("/api/v2/users?page=-3") == [u["username"] for u in first]
    )
    assert client.get("/api/v2/users?page=10001").json() == []
    assert client.get(f"/api/v2/users?page={'9' * 400}").json() == []
    refused = client.get("/api/v2/users?page=two")
    assert refusal(refused) == (400, "ValidationError") and "page" in refused.json()["errors"]


def test_a_moderator_trusts_bounds_and_notes_an_account_each_change_logged_as_in_the_admin(boss, owner):
    answer = put_user(
        boss,
        owner.account,
        {"trusted": True, "concurrency": 5, "worker_invited": 4, "admin_comment": "Runs the big box."},
    )

    assert answer.status_code == 200, answer.content
    assert answer.json() == {
        "trusted": True,
        "concurrency": 5,
        "worker_invited": 4,
        "admin_comment": "Runs the big box.",
    }
    account = Account.objects.get(pk=owner.account.pk)
    assert (account.trusted, account.max_waiting_requests, account.worker_limit) == (True, 5, 4)
    by = f" through the API by boss#{boss.account.pk}"
    assert entries(account) == [
        "Changed Max waiting requests and Worker limit and Admin comment" + by,
        moderation.TRUST_WORDS[True] + by,
    ]
    seen = owner.client.get(f"/api/v2/users/{account.pk}", HTTP_APIKEY=boss.api_key).json()
    assert (seen["trusted"], seen["concurrency"], seen["worker_invited"]) == (True, 5, 4)
    assert seen["admin_comment"] == "Runs the big box."
    assert "admin_comment" not in owner.client.get(f"/api/v2/users/{account.pk}").json()
    # 0 invites no one: the horde's limit again, as the AI Horde's default is 0.
    assert put_user(boss, account, {"worker_invited": 0}).json() == {"worker_invited": 0}
    assert Account.objects.get(pk=account.pk).worker_limit is None
    assert put_user(boss, account, {"customizer": True}).json() == {"customizer": True}
    assert Account.objects.get(pk=account.pk).customizer
    assert put_user(owner, account, {"customizer": False}).status_code == 403  # a moderator's


def test_a_moderator_flags_an_account_and_unflagging_or_a_reset_clears_it_as_the_admins_action(boss, owner):
    assert put_user(boss, owner.account, {"flagged": True}).json() == {"flagged": True}
    account = Account.objects.get(pk=owner.account.pk)
    assert account.flagged_at is not None
    assert owner.client.get(f"/api/v2/users/{account.pk}").json()["flagged"] is True
    refused = owner.pop("flagged-worker").json()
    assert (refused["id"], refused["skipped"]) == (None, {})  # a flagged account's worker gets nothing

    assert put_user(boss, account, {"flagged": False}).json() == {"flagged": False}
    Suspicion.objects.create(account=account, reason=Suspicion.Reason.ABORTS, detail="x")
    assert put_user(boss, account, {"reset_suspicion": True}).json() == {"new_suspicion": 0}
    assert not Suspicion.objects.filter(account=account).exists()
    assert Account.objects.get(pk=account.pk).flagged_at is None
    by = f" through the API by boss#{boss.account.pk}"
    assert entries(account) == [
        moderation.FLAGGED + by,
        moderation.SUSPICIONS_CLEARED + by,
        moderation.SUSPICIONS_CLEARED + by,
    ]
    # False resets nothing (the AI Horde would), so it selects nothing.
    assert refusal(put_user(boss, account, {"reset_suspicion": False})) == (400, "NoUserModSelected")


def test_kudos_a_moderator_gives_are_minted_by_the_ledger_logged_and_the_ledger_still_balances(boss, owner):
    put = put_user(boss, owner.account, {"kudos": 50.0})
    assert put.status_code == 200 and put.json() == {"new_kudos": 50.0}
    awarded = boss.post("/api/v2/kudos/award", {"username": f"owner#{owner.account.pk}", "amount": 100})
    assert awarded.status_code == 200 and awarded.json() == {"awarded": 100.0}
    default = boss.post("/api/v2/kudos/award", {"username": str(owner.account.pk)})
    assert default.json() == {"awarded": 100.0}  # the AI Horde's default amount

    assert ledger.balance(owner.account.pk) == Decimal("250.00")
    events = Event.objects.filter(kind=Event.Kind.AWARD).order_by("pk")
    assert [event.reason for event in events] == [f"awarded through the API (by boss#{boss.account.pk})"] * 3
    user = owner.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key).json()
    assert (user["kudos"], user["kudos_details"]["awarded"]) == (250, 250)
    by = f" through the API by boss#{boss.account.pk}"
    assert entries(owner.account) == [
        f"Awarded 50 kudos{by}",
        f"Awarded 100 kudos{by}",
        f"Awarded 100 kudos{by}",
    ]
    call_command("check_kudos")  # raises if the ledger does not reconcile


def test_strangers_and_the_anonymous_key_are_refused_in_the_ai_hordes_shape(
    boss, owner, requester, anonymous
):
    for caller in (requester, anonymous):
        for body in ({"trusted": True}, {"kudos": 10}, {"concurrency": 3}, {"reset_suspicion": True}):
            assert refusal(put_user(caller, owner.account, body)) == (403, "NotModerator"), body
        # The account's own fields too, but on itself.
        assert refusal(put_user(caller, owner.account, {"contact": "me@example.org"})) == (
            403,
            "NotModerator",
        )
        award = caller.post("/api/v2/kudos/award", {"username": f"owner#{owner.account.pk}", "amount": 5})
        assert refusal(award) == (403, "NotAllowedAwards")
        modes = caller.client.put(
            "/api/v2/status/modes", {"raid_mode": True}, format="json", HTTP_APIKEY=caller.api_key
        )
        assert refusal(modes) == (403, "NotModerator")
    assert refusal(put_user(anonymous, anonymous.account, {"public_workers": True})) == (
        403,
        "AnonForbiddenUserMod",
    )
    # No key, or an unknown one.
    assert refusal(
        owner.client.put(f"/api/v2/users/{owner.account.pk}", {"trusted": True}, format="json")
    ) == (
        401,
        "InvalidAPIKey",
    )
    assert refusal(owner.client.post("/api/v2/kudos/award", {"username": "owner"}, format="json")) == (
        401,
        "InvalidAPIKey",
    )
    # Moderators are the operator's to make, in the admin (the AI Horde's admins').
    assert refusal(put_user(boss, owner.account, {"moderator": True})) == (403, "NotAdmin")
    # All or nothing: a refused field leaves the others unset.
    assert refusal(put_user(owner, owner.account, {"contact": "me@example.org", "trusted": True})) == (
        403,
        "NotModerator",
    )
    account = Account.objects.get(pk=owner.account.pk)
    assert (account.trusted, account.contact, account.moderator) == (False, "", False)
    assert not Event.objects.exists() and not LogEntry.objects.exists()
    assert HordeModes.objects.filter(raid=True).count() == 0


def test_an_account_sets_its_own_name_contact_and_public_workers_unlogged(owner, requester):
    owner.pop("public-one")
    answer = put_user(
        owner, owner.account, {"public_workers": True, "contact": "me@example.org", "username": "Own"}
    )

    assert answer.json() == {"public_workers": True, "contact": "me@example.org", "username": "Own"}
    public = requester.client.get(f"/api/v2/users/{owner.account.pk}").json()
    assert public["username"] == f"Own#{owner.account.pk}" and len(public["worker_ids"]) == 1
    assert "contact" not in public  # the account's and moderators' to see
    own = owner.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key).json()
    assert own["contact"] == "me@example.org"
    assert not LogEntry.objects.exists()  # not a moderator's act


def test_a_service_account_makes_its_own_proxy_passkey_answered_once_and_kept_hashed(owner, boss):
    from workers.models import hash_api_key

    Account.objects.filter(pk=owner.account.pk).update(service=True)
    answer = put_user(owner, owner.account, {"generate_proxy_passkey": True})

    passkey = answer.json()["proxy_passkey"]
    assert answer.status_code == 200 and passkey
    stored = Account.objects.get(pk=owner.account.pk).proxy_passkey_hash
    assert stored == hash_api_key(passkey) != passkey
    assert entries(owner.account) == []  # the account's own act
    renewed = put_user(boss, owner.account, {"generate_proxy_passkey": True}).json()["proxy_passkey"]
    assert renewed != passkey
    by = f" through the API by boss#{boss.account.pk}"
    assert entries(owner.account) == [moderation.PASSKEY_MADE + by]  # in the admin action's words


def test_bad_values_and_fields_hordeops_has_not_are_refused_with_the_ai_hordes_codes(boss, owner, anonymous):
    def field_refused(body, field):
        answer = put_user(boss, owner.account, body)
        assert refusal(answer) == (400, "ValidationError") and field in answer.json()["errors"], body
        return answer.json()["errors"][field]

    field_refused({"concurrency": 501}, "concurrency")
    field_refused({"concurrency": "5"}, "concurrency")
    assert "none are taken away" in field_refused({"kudos": -5}, "kudos")
    field_refused({"kudos": 1.5}, "kudos")
    field_refused({"kudos": 10**10}, "kudos")  # over the most one award mints
    field_refused({"admin_comment": "tiny"}, "admin_comment")
    field_refused({"username": "a\u202ebc"}, "username")
    assert "in the admin" in field_refused({"service": True}, "service")
    assert "monthly kudos" in field_refused({"monthly_kudos": 100, "trusted": True}, "monthly_kudos")
    assert refusal(put_user(boss, owner.account, {"username": "x" * 31})) == (400, "TooLongUserName")
    assert refusal(put_user(boss, owner.account, {})) == (400, "NoUserModSelected")
    assert refusal(put_user(boss, owner.account, {"generate_proxy_passkey": True})) == (
        403,
        "NonServiceForbidden",
    )
    assert refusal(put_user(boss, owner.account, {"undelete": True})) == (400, "UserNotDeleted")
    for unknown in ("999999", "abc", "9" * 40):
        answer = boss.client.put(
            f"/api/v2/users/{unknown}", {"trusted": True}, format="json", HTTP_APIKEY=boss.api_key
        )
        assert refusal(answer) == (404, "UserNotFound")

    def award(username, amount=10):
        return boss.post("/api/v2/kudos/award", {"username": username, "amount": amount})

    assert refusal(award("nobody#999999")) == (400, "InvalidAwardUsername")
    assert refusal(award(f"Anonymous#{anonymous.account.pk}")) == (400, "KudosAwardToAnon")
    assert refusal(put_user(boss, anonymous.account, {"kudos": 5})) == (400, "KudosAwardToAnon")
    assert refusal(award(f"owner#{owner.account.pk}", 0)) == (400, "ValidationError")
    assert refusal(award(f"owner#{owner.account.pk}", 10**10)) == (400, "ValidationError")
    Account.objects.filter(pk=owner.account.pk).update(flagged_at="2026-01-01T00:00:00Z")
    assert refusal(award(f"owner#{owner.account.pk}")) == (400, "TargetAccountFlagged")
    assert not Event.objects.exists() and not LogEntry.objects.exists()


def test_a_moderator_sets_the_horde_modes_as_in_the_admin_logged(boss, requester):
    def put_modes(body):
        return boss.client.put("/api/v2/status/modes", body, format="json", HTTP_APIKEY=boss.api_key)

    assert put_modes({"maintenance_mode": True}).json() == {"maintenance_mode": True}
    assert refusal(requester.request_text()) == (400, "MaintenanceMode")
    assert requester.client.get("/api/v2/status/modes").json() == {
        "maintenance_mode": True,
        "invite_only_mode": False,
        "raid_mode": False,
    }
    both = put_modes({"maintenance_mode": False, "invite_only_mode": True, "raid_mode": None})
    assert both.json() == {"maintenance_mode": False, "invite_only_mode": True}
    assert requester.request_text().status_code == 202
    logged = LogEntry.objects.filter(content_type__model="hordemodes", object_id="1").order_by("pk")
    by = f" through the API by boss#{boss.account.pk}"
    assert list(logged.values_list("change_message", flat=True)) == [
        "Changed Maintenance" + by,
        "Changed Maintenance and Invite only" + by,
    ]
    # Nothing the horde has: the AI Horde's refusal of an empty change.
    assert refusal(put_modes({})) == (400, "NoHordeModSelected")
    assert refusal(put_modes({"shutdown": True})) == (400, "NoHordeModSelected")
    assert refusal(put_modes({"raid_mode": "yes"})) == (400, "ValidationError")
